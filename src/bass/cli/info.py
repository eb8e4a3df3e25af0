"""The subcommands that only inform: ``bass policies``, ``bass ops`` and ``bass bench``."""

from __future__ import annotations

import textwrap
from pathlib import Path

from .errors import flag_error

__all__ = ["cmd_bench", "cmd_ops", "cmd_policies"]


def cmd_policies(args) -> int:
    from .. import plugins, policies

    installed = policies.available()
    if not installed:
        print("no draft-length policies installed (entry-point group 'bass.policies')")
        return 0
    for name, ep in installed.items():
        where = ep.value  # another package's: and which (two packages': said below)
        if not (plugins.is_own(ep, policies.GROUP) or isinstance(ep, plugins.AmbiguousEntryPoint)):
            where += f", from {plugins.origin(ep)}"
        try:
            target = policies.registry._target(name)[0]  # errors as Python names them
            infos, any_option = policies.registry._options(target)
        except Exception as exc:  # a broken plugin: say so, list the others
            why = (
                exc
                if isinstance(exc, policies.PolicyLoadError)
                else (f"failed to load: {type(exc).__name__}: {exc}")
            )  # (a PolicyLoadError says what failed, as Python raises it)
            print(f"{name}  ({where})\n    {why}\n")
            continue
        hooks = ("update",), ("draft_length", "draft_lengths")
        if isinstance(target, type) and not all(  # a class without a policy's hooks
            any(callable(getattr(target, h, None)) for h in need) for need in hooks
        ):
            print(f"{name}  ({where})\n    not a policy: lacks draft_length() (or "
                  "draft_lengths(ctx)) or update(record) (see bass.hooks.Policy)\n")  # fmt: skip
            continue
        doc = " ".join((target.__doc__ or "").strip().split("\n\n")[0].split())
        default = "  [default]" if name == policies.DEFAULT else ""
        print(f"{name}  ({where}){default}")
        kinds = policies.base.capabilities(target)
        print(f"    decides: {', '.join(kinds)}")
        if doc:
            print(textwrap.fill(doc, 92, initial_indent="    ", subsequent_indent="    "))
        if any_option:  # **kwargs: whatever --policy-option gives, passed as given
            print("    (takes any option: each --policy-option NAME=VALUE passed as given)")
        elif not infos:
            print("    (no options)")
        width = max((len(f"{i.name} = {i.default!r}") for i in infos), default=0)
        for i in infos:
            print(f"    {f'{i.name} = {i.default!r}'.ljust(width)}  {i.help}".rstrip())
        print()
    print(
        "Select one with --policy NAME (or [policy] name in a config file) and set options "
        "with --policy-option NAME=VALUE ([policy.options])."
    )
    return 0


def cmd_bench(args) -> int:
    candidates = [
        Path(__file__).resolve().parents[3] / "bench" / "results",
        Path.cwd() / "bench" / "results",
    ]
    found = sorted(
        {p for d in candidates if d.is_dir() for p in d.glob("*.md")},
        key=lambda p: p.stat().st_mtime,
    )
    if found:
        print(f"latest bench results: {found[-1]}")
        if len(found) > 1:
            print("others: " + ", ".join(str(p) for p in reversed(found[:-1])))
    else:
        where = " or ".join(str(d) for d in dict.fromkeys(candidates))
        print(f"no bench results found (looked in {where})")
    print(
        "`nox -s bench` (from a checkout of the bass repository) reruns the committed "
        "benchmark commands and writes bench/results/; bench/README.md says which command "
        "wrote which file."
    )
    return 0


def cmd_ops(args) -> int:
    """The ragged attention implementations, where each runs, and what ``auto`` picks per
    device and pass kind, and why (``--device`` asks about a device this machine lacks)."""
    import torch

    from ..ops import PASS_KINDS, plan

    wanted = getattr(args, "device", None)
    if wanted is not None:
        supported = plan.IMPLEMENTATIONS["reference"].devices
        try:
            kind = torch.device(wanted).type
        except RuntimeError:
            kind = None
        if kind not in supported:
            raise flag_error(
                "--device", wanted, f"a device type bass runs on: {', '.join(supported)}"
            )
    devices = [torch.device(wanted)] if wanted else [torch.device("cpu")]
    if not wanted and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    print(
        "ragged attention implementations (impl=NAME of torch.ops.bass.ragged_attention and "
        "ragged_attention_packed):"
    )
    for name, impl in plan.IMPLEMENTATIONS.items():
        why = impl.unavailable()
        state = "runs here" if why is None else f"not available here: {why}"
        launch = "one launch per layer" if impl.single_launch else "several launches per layer"
        print(f"  {name:<10} on {'/'.join(impl.devices):<9} {launch}; {state}")
        print(
            textwrap.fill(impl.description, 92, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )
    for device in devices:
        # a device this machine lacks: what auto picks on a machine that has one
        absent = device.type == "cuda" and not torch.cuda.is_available()
        where = " (none here: what a machine with one picks)" if absent else ""
        print(f"\nauto on {device.type}{where} (every layer of a pass runs the pick):")
        for kind in PASS_KINDS:
            if absent:  # the pick as such, not this process's fallback to the reference
                name, why = plan.auto_pick(device.type, kind)
                impl = plan.IMPLEMENTATIONS[name]
            else:
                impl, why = plan.resolve("auto", device, kind)
            launch = "one launch per layer" if impl.single_launch else "not one launch per layer"
            line = f"{kind:<9} {impl.name} ({launch}): {why}"
            print(textwrap.fill(line, 92, initial_indent="  ", subsequent_indent=" " * 14))
    print(
        "\nPass kinds: eager; compiled (torch.compile); graphs (compiled with static shapes: "
        "CUDA graphs). A generation's picks are in res.stats.attention; impl=NAME (attention= "
        "for the Generator) overrides auto."
    )
    from ..backends import PACKED_MEMORY_SHARE, available_memory

    free = available_memory()
    have = "unknown" if free is None else f"{free / 2**30:.1f} GiB"
    print(
        f"\ndevice tuning on cpu (bass.backends.CPUBackend): linear layers in their measured-"
        f"fastest layouts (cpu_linear='auto'); packed weight copies only within "
        f"{PACKED_MEMORY_SHARE:.0%} of the free memory (free now: {have}); a generation's "
        "choice is in res.stats.backend"
    )
    return 0

"""The subcommands that only inform: ``bass policies``, ``bass ops`` and ``bass bench``."""

from __future__ import annotations

import textwrap
from pathlib import Path

__all__ = ["cmd_bench", "cmd_ops", "cmd_policies"]


def cmd_policies(args) -> int:
    from .. import policies

    installed = policies.available()
    if not installed:
        print("no draft-length policies installed (entry-point group 'bass.policies')")
        return 0
    for name, ep in installed.items():
        try:
            target = ep.load()
            infos = policies.describe(name)
        except Exception as exc:  # a broken plugin: say so, list the others
            print(f"{name}  ({ep.value})\n    failed to load: {type(exc).__name__}: {exc}\n")
            continue
        doc = " ".join((target.__doc__ or "").strip().split("\n\n")[0].split())
        default = "  [default]" if name == policies.DEFAULT else ""
        print(f"{name}  ({ep.value}){default}")
        kinds = policies.base.capabilities(target)
        print(f"    decides: {', '.join(kinds)}")
        if doc:
            print(textwrap.fill(doc, 92, initial_indent="    ", subsequent_indent="    "))
        if not infos:
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
    """The ragged attention implementations, where each runs, and what ``auto`` uses."""
    import torch

    from .. import ops
    from ..ops import auto, cutlass

    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    print("torch.ops.bass.ragged_attention implementations (impl=NAME):")
    for name, impl in ops._IMPLEMENTATIONS.items():
        here = [d.type for d in devices if d.type in impl.devices]
        if not here:
            state = f"not here: no {'/'.join(impl.devices)} device"
        elif impl.available():
            state = "runs here"
        elif name in ("pad", "split"):
            state = f"not available: {cutlass.unavailable_reason()}"
        else:
            state = "not available (see below)"
        print(f"  {name:<12} on {'/'.join(impl.devices):<9} {state}")
        print(
            textwrap.fill(impl.description, 92, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )
    print()
    for device in devices:
        key = auto.device_key(device)
        rule = auto.load_rule(key)
        static = ops.resolve_implementation("auto", device).name
        if rule is None:
            print(f"auto on {key}: no calibrated rule; the static order runs `{static}`")
            continue
        where = next(d for d in auto.rules_dirs() if (d / f"{key}.json").is_file())
        print(
            f"auto on {key}: rule {where / (key + '.json')} ({len(rule.points)} measured "
            f"points over {', '.join(rule.implementations)}; from {rule.source or '?'})"
        )
    print(
        "\nCalibrate for this machine: `nox -s calibrate` (set BASS_AUTO_RULES=DIR to keep "
        "your rules outside the package)."
    )
    from ..ops import packed

    print("\ntorch.ops.bass.ragged_attention_packed implementations (the engine's passes):")
    for name, impl in packed._PACKED.items():
        here = [d.type for d in devices if d.type in impl.devices]
        if not here:
            state = f"not here: no {'/'.join(impl.devices)} device"
        else:
            state = "runs here" if impl.available() else "not available"
        print(f"  {name:<12} on {'/'.join(impl.devices):<9} {state}")
        print(
            textwrap.fill(impl.description, 92, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )
    for device in devices:
        pick = packed.resolve_packed_implementation("auto", device).name
        planned = packed.resolve_packed_implementation("auto", device, planned=True).name
        print(
            f"auto on {device.type}: `{planned}` in the engine's eager passes (planned once per "
            f"pass from host lengths), `{pick}` when the op is called directly or compiled"
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

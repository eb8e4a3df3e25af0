"""Machine measurements the benchmark scripts share."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from pathlib import Path

import torch


def git_commit() -> str:
    """The commit the benchmark ran (``+dirty`` with uncommitted changes to tracked
    files), or ``unknown`` outside a git checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True
        )
        if head.returncode:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


#: The commit when this benchmark's process started: a long run's record is not marked
#: ``+dirty`` by edits made while it ran, nor credited to a commit made meanwhile.
STARTED_AT = git_commit()


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s, else ``platform.processor()``), or
    ``unknown``: 2-CPU VMs of one name may sit on very different hosts, so it is recorded."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_meta(script: str, argv, *, cuda: bool = False, **extra) -> dict:
    """What a result file records about its run: the command (``python bench/<script>``
    with ``argv``), the git commit, the date (UTC), the machine (the CUDA device's name
    with ``cuda``, else the CPU's architecture and model name, its CPU count and torch's
    thread count),
    the software; ``extra`` entries are added as given."""
    machine = (
        torch.cuda.get_device_name()
        if cuda
        else f"{platform.machine()} ({cpu_name()}), {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads"
    )
    return {
        "command": " ".join(["python", f"bench/{script}", *argv]),
        "commit": STARTED_AT,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "software": f"torch {torch.__version__}, Python {platform.python_version()}",
        **extra,
    }


def header(title: str, meta: dict, machine: str = "Machine") -> list[str]:
    """A result file's first lines: its title, then the command, date, machine (under
    the label ``machine``, read from ``meta[machine.lower()]``), commit and software of
    :func:`run_meta`, one per line (markdown line breaks)."""
    return [
        f"# {title}",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: {meta.get('commit', 'unknown')}  ",
        f"Date: {meta['date']}  ",
        f"{machine}: {meta[machine.lower()]}  ",
        f"Software: {meta['software']}  ",
    ]


def copy_bandwidth_gbs(device="cuda", nbytes: int = 1 << 30) -> float:
    """Measured device copy bandwidth (read + write bytes / time), GB/s: the memory
    bandwidth a bandwidth-bound kernel can hope for on this device."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(3):
        y.copy_(x)
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync()
    return 2 * x.numel() * 10 / (time.perf_counter() - t0) / 1e9


def write_results(out: Path, name: str, data: dict, markdown) -> None:
    """``out/name.json`` (``data``) and ``out/name.md`` (``markdown(data)``), then the
    markdown printed: what each benchmark script leaves behind."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    text = markdown(data)
    (out / f"{name}.md").write_text(text + "\n")
    print(text)

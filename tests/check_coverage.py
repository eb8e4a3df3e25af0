"""Check that the test run exercised every line and branch of the batch-shape code.

``python tests/check_coverage.py coverage.json`` reads a coverage.py JSON report (``nox -s
tests`` writes one: ``pytest --cov=bass --cov-branch --cov-report=json:coverage.json``)
and fails, naming the function, line and branch, unless each function in
:data:`FUNCTIONS` (prefill, the draft model's prefill, admission into free slots, rows
sharing a prompt's cache rows, batch compaction) has no missing line and no missing
branch. These are where rows get mapped to cache slots; a bug there gives another row's
text, so the batch-invariance and scheduler tests must reach all of it.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "bass"

# file (under src/bass) -> qualified function names
FUNCTIONS = {
    "passes.py": ["prefill"],
    "drafters.py": ["ModelDrafter.start", "ModelDrafter.admit", "ModelDrafter.compact"],
    "engine.py": ["Generator._compact"],
    "batch_state.py": [
        "BatchState.compact",
        "BatchState.admit",
        "BatchState.free",
        "BatchState.start",
        "BatchState.copies",
    ],
    "scheduler.py": ["Queue.admit", "prefill", "share_prompts", "prompt_tokens"],
    "cache.py": ["RaggedKVCache.compact", "RaggedKVCache.copy_prefix"],
}


def spans(path: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    """name -> (first line, last line) of each function (methods as Class.method)."""
    tree = ast.parse(path.read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = (item.lineno, item.end_lineno)
        elif isinstance(node, ast.FunctionDef):
            found.setdefault(node.name, (node.lineno, node.end_lineno))
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"{path}: no function {missing} (update FUNCTIONS)")
    return {n: found[n] for n in names}


def main(report: str) -> int:
    data = json.loads(Path(report).read_text())["files"]
    problems = []
    for file, names in FUNCTIONS.items():
        key = next((k for k in data if k.replace("\\", "/").endswith(f"bass/{file}")), None)
        if key is None:
            problems.append(f"{file}: not in the coverage report")
            continue
        info = data[key]
        for name, (lo, hi) in spans(SRC / file, names).items():
            lines = [n for n in info["missing_lines"] if lo <= n <= hi]
            branches = [b for b in info.get("missing_branches", []) if lo <= b[0] <= hi]
            if lines or branches:
                problems.append(
                    f"{file}:{name}: lines never run {lines}, branches never taken "
                    f"{[f'{a}->{b}' for a, b in branches]}"
                )
            else:
                print(f"ok  {file}:{name} (lines {lo}-{hi}): every line and branch ran")
    for p in problems:
        print("MISSING  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "coverage.json"))

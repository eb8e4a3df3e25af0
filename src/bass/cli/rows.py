"""The rows of a ``bass generate`` run: each row's ``--output`` record (strict JSON), its
lines on screen, the note of a run that stopped early, and the error that names a row's
prompt (docs/guides/config-and-cli.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .errors import UsageError, flag_error, say, stdout_to_devnull
from .report import for_terminal
from .results import Prompt

__all__ = [
    "LOGPROB_FLOOR",
    "budget_error",
    "kept_note",
    "line",
    "print_merged",
    "print_rows",
    "row_error",
    "stdout_closed",
]

#: What ``--output`` writes for a log-probability of -inf (a token whose logit the model
#: masks): JSON has no infinity, and vLLM's OpenAI server writes the same floor.
LOGPROB_FLOOR = -9999.0


def line(record: dict) -> str:
    """``record`` as one line of strict JSON (what ``json.loads`` and other languages'
    parsers read): a log-probability of -inf as :data:`LOGPROB_FLOOR`; a NaN is refused
    (a model's NaN logits raise before a row is made)."""
    for key in ("logprobs", "prompt_logprobs"):
        if key in record:
            record = record | {key: [_finite(x) for x in record[key]]}
    return json.dumps(record, allow_nan=False) + "\n"


def _finite(x: float | None) -> float | None:
    return LOGPROB_FLOOR if x is not None and math.isinf(x) and x < 0 else x


def stdout_closed(out_path, exc: OSError) -> bool:
    """Standard output's reader left (a pipe into ``head``) or a write to it failed (a full
    disk): what would be printed goes nowhere, the rows go on to ``--output`` (stderr says)."""
    stdout_to_devnull()
    why = (
        "was closed (its reader left)"
        if isinstance(exc, BrokenPipeError)
        else f"failed ({exc.strerror or exc})"
    )
    say(f"note: standard output {why}: the rows go on to {out_path} only")
    return True


def print_rows(records: list[dict], n: int) -> None:
    """Each row under a ``>>>`` header: its prompt's first line (``[...]`` when it has
    more: a code block to edit, a document), then the completion."""
    for r in records:
        tag = f" (sample {r['sample'] + 1}/{n})" if n > 1 else ""
        first, _, rest = r["prompt"].strip().partition("\n")
        head = first + (" [...]" if rest.strip() else "")
        print(for_terminal(f">>> {head}{tag}\n{r['completion']}\n"), flush=True)


def print_merged(out: Path, done: set, n: int, expected: int) -> None:
    """Rank 0, after a data-parallel run merged its shards: this run's rows (those not in
    ``done``), printed from ``out`` a line at a time; fewer than the groups wrote is an
    error (a shard rank 0 could not read), never a silently shorter file."""
    printed = 0
    with out.open("rb") as f:
        for line in f:
            row = json.loads(line)
            if (row["prompt_index"], row["sample"]) not in done:
                print_rows([row], n)
                printed += 1
    if printed < expected:
        raise UsageError(
            f"--output {out}: the data-parallel groups wrote {expected} rows, but only "
            f"{printed} were in the shards rank 0 merged; the others' shards "
            f"({out.name}.rank<r>) are where their ranks wrote them: put them beside {out} "
            "and rerun with --resume"
        )


def kept_note(written: int, total: int, done: set, out_path: Path | None, scale) -> str:
    """The last line of a run that stopped early: the rows kept, and how to go on."""
    if scale.sharded and out_path is not None:
        return (
            f"rank {scale.topo.rank}: {written} rows of its share are in "
            f"{scale.shard_path(out_path)}; rerun the same command with --resume to generate "
            "the rest"
        )
    if out_path is None:
        return (
            f"{written} of {total} rows were generated and printed above; pass --output FILE to "
            "keep rows in a file (and --resume to continue a stopped run)"
        )
    before = f" ({len(done)} of them before this run)" if done else ""
    if not out_path.is_file():  # /dev/null, /dev/full: nothing to resume from
        return f"{written} of {total} rows were written to {out_path}"
    return (
        f"{written + len(done)} of {total} rows are in {out_path}{before}; rerun the same "
        "command with --resume to generate the rest"
    )


def budget_error(exc):
    """The library's refusal of a KV budget too small for one row, named as its flag."""
    return flag_error("--kv-budget-gib", exc.value, exc.allowed)


def row_error(exc: BaseException, batch: list, prompts: list[Prompt], n: int) -> BaseException:
    """The error a failed generation reports: for what a user can fix, one that names its
    prompt by where it came from; the error as is otherwise (Ctrl-C, a bug)."""
    import torch

    from ..batch_state import NonFiniteLogitsError, PromptError

    k = getattr(exc, "prompt", None)
    if isinstance(exc, (PromptError, NonFiniteLogitsError)) and k is not None:
        i, s = batch[k]
        sample = f" (sample {s + 1} of {n})" if n > 1 else ""
        return UsageError(exc.naming(f"the prompt at {prompts[i].where}{sample}"))
    if isinstance(exc, MemoryError):  # the KV budget holds not even one row
        return UsageError(f"{exc} (--kv-budget-gib on the command line)")
    if getattr(exc, "option", None) == "kv_budget_gib":  # too small for one row: as its flag
        return budget_error(exc)
    if isinstance(exc, RuntimeError) and "DefaultCPUAllocator" in str(exc):  # a CPU's OOM
        first = str(exc).split("\n")[0]
        return UsageError(
            f"out of memory: {first}; lower --batch-size, --kv-budget-gib or --max-new-tokens"
        )
    if isinstance(exc, torch.OutOfMemoryError):
        first = str(exc).split("\n")[0]
        return UsageError(f"out of memory: {first}; lower --batch-size or --max-new-tokens")
    return exc  # OptionError, PluginError...: main reports them; anything else is a bug

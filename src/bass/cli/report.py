"""``bass generate``'s report of a run: the summary it prints and the ``--plot`` chart."""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["comparison_text", "for_terminal", "plot_steps", "short_trace", "summary_text"]

# C0 controls but tab and newline, DEL, C1 controls: what a terminal acts on
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def for_terminal(text: str, stream=None) -> str:
    """``text`` as printed to ``stream`` (standard output): where that is a terminal, its
    control characters but newline and tab shown as escapes (``\\x1b``), so a model's
    output cannot move the cursor, clear the screen or retitle the window (the results file
    holds the text as it is)."""
    stream = sys.stdout if stream is None else stream
    if not (getattr(stream, "isatty", None) and stream.isatty()):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def short_trace(trace: list[int], head: int = 16, tail: int = 8) -> str:
    """``"7 9 11 ... 4 3 (40 steps)"``."""
    if len(trace) <= head + tail:
        body = " ".join(map(str, trace))
    else:
        body = " ".join(map(str, trace[:head])) + " ... " + " ".join(map(str, trace[-tail:]))
    return f"{body} ({len(trace)} steps)" if trace else "(no steps)"


def _size(nbytes: int) -> str:
    """``nbytes`` in GiB, MiB or KiB, whichever shows it with a digit before the point."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"


def summary_text(stats, *, rows: int, finish_reasons=None) -> str:
    s = stats
    budget = ""
    if s.kv_budget_bytes:
        budget = f"; KV budget {_size(s.kv_budget_bytes)}, {_size(s.kv_bytes_per_row)} per row"
    prefill = f"prefill {s.prefill_seconds:.2f} s"
    if s.riding_admissions:  # their prefill's time is their verify pass's, not counted here
        prefill += (
            f" in its own passes; {s.riding_admissions} of {s.admissions} admissions rode in "
            "verify passes"
        )
    if s.shared_prompt_tokens:  # a prompt's samples: its prefill computed once
        prefill += f"; {s.shared_prompt_tokens} prompt tokens copied between samples"
    lines = [
        "summary",
        f"  rows                {rows} ({s.max_rows} at once{budget})",
        f"  tokens generated    {s.tokens_generated} in {s.wall_seconds:.2f} s "
        f"({s.tokens_per_second:.1f} tokens/s, {prefill})",
        f"  mean accepted       {s.mean_accepted:.2f} draft tokens per step per row",
        f"  main-model passes   {s.main_passes} ({s.main_passes_per_token:.3f} per token)",
        f"  draft-model passes  {s.draft_passes}",
        f"  draft length        {short_trace(s.draft_length_trace())}",
    ]
    if finish_reasons:
        counts = {r: finish_reasons.count(r) for r in dict.fromkeys(finish_reasons)}
        ended = ", ".join(f"{n} {r}" for r, n in counts.items())
        lines.append(f"  rows ended by       {ended}")
    if s.stopped_by_time_budget:
        lines.append("  stopped by the time budget")
    return "\n".join(lines)


def comparison_text(plain, tokens, gen, sampled: bool = False) -> str:
    """``--compare``'s report: drafting off (``plain``, its result) against bass (``gen``,
    which made ``tokens`` of the same rows; ``sampled``: rows drawn, not greedy)."""
    off, on = plain.stats, gen.stats
    same = sum(x == y for x, y in zip(plain.sequences, tokens, strict=True))
    drafter = getattr(gen.drafter, "name", "none")
    policy = gen.policy_spec[0] if isinstance(gen.policy_spec[0], str) else "custom"
    speedup = off.wall_seconds / on.wall_seconds if on.wall_seconds else float("nan")
    label = f"bass ({drafter}, {policy})"
    lines = [
        "\ncomparison (the same rows and settings; drafting off ran first)",
        f"  {'drafting off':<24}  {off.wall_seconds:.2f} s ({off.tokens_per_second:.1f} tokens/s)",
        f"  {label:<24}  {on.wall_seconds:.2f} s ({on.tokens_per_second:.1f} tokens/s), "
        f"{on.mean_accepted:.2f} accepted tokens per step per row",
        f"  {'identical rows':<24}  {same} of {len(tokens)}",
        f"speedup over drafting off: {speedup:.2f}x",
    ]
    rejection = gen.draft_sampling == "rejection" and drafter == "model"  # (n-grams: keyed)
    if sampled and rejection and same < len(tokens):
        lines[-2] += (
            " (rejection sampling's draws depend on the batch and the drafts: sampled rows "
            "differ from drafting off's, each exact in distribution; --draft-sampling coupled "
            "keeps them equal)"
        )
    return "\n".join(lines)


def plot_steps(path: str, batch_stats) -> None:
    """Draft length and mean accepted tokens per step, batches one after another."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x0 = 0
    for b, stats in enumerate(batch_stats):
        xs = list(range(x0, x0 + stats.step_count))
        k, acc = list(stats.draft_lengths), list(stats.accepted_means)
        ax.step(xs, k, where="mid", color="tab:blue", label="draft length" if b == 0 else None)
        ax.plot(xs, acc, ".-", color="tab:orange", label="mean accepted" if b == 0 else None)
        if b:
            ax.axvline(x0 - 0.5, color="grey", linestyle=":", linewidth=1)
        x0 += stats.step_count
    ax.set_xlabel("step (batches one after another)")
    ax.set_ylabel("tokens")
    ax.set_title("bass: draft length and mean accepted tokens per step")
    ax.legend()
    fig.tight_layout()
    # the format named: with none, matplotlib would write PATH.png (over --output, maybe)
    fig.savefig(path, dpi=120, format=Path(path).suffix[1:].lower() or "png")

"""The report of ``bench/continuous.py``: the rows' spread, the equality check against the
reference method, and the markdown table and text."""

from __future__ import annotations

import json
import statistics

from _machine import header

GB = "transformers-generate_batch"
REFERENCE = "bass-static-off"  # the rows every bass method must equal
ORDERS = {
    "shuffled": "a fixed shuffled order (seed 0)",
    "given": "the given order (CHAT_MIXED's: by answer length, static batching's best case)",
}


def spread(lengths: list[int], cap: int) -> dict:
    return {
        "min": min(lengths),
        "median": statistics.median(lengths),
        "max": max(lengths),
        "at_cap": sum(n >= cap for n in lengths),
    }


def compare(results: dict) -> dict:
    """Per method: the rows that differ from the reference (bass-static-off) token for
    token (the CLI: its text and token count)."""
    ref = results.get(REFERENCE)
    if ref is None:
        return {}
    out = {}
    for m, r in results.items():
        if m == REFERENCE:
            continue
        if m == "cli":
            bad = [
                i
                for i, (t, n, rt, rs) in enumerate(
                    zip(r["texts"], r["lengths"], ref["texts"], ref["sequences"], strict=True)
                )
                if t != rt or n != len(rs)
            ]
        else:
            bad = [
                i
                for i, (a, b) in enumerate(zip(r["sequences"], ref["sequences"], strict=True))
                if a != b
            ]
        out[m] = bad
    return out


def table(rows: list[dict], cap: int) -> list[str]:
    lines = [
        "| method | new tokens | wall s | tokens/s | vs generate_batch | vs bass static "
        "(same drafting) | peak RSS MiB | load s | setup s | answer tokens min / median / "
        f"max (at cap {cap}) | mean accepted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def num(x, fmt, unit=""):
        return "" if x is None else format(x, fmt) + unit

    def rounds(xs, fmt, unit=""):  # each round's, after the median, when more than one ran
        return f" ({' / '.join(format(x, fmt) + unit for x in xs)})" if xs and len(xs) > 1 else ""

    for r in rows:
        d = r["lengths_spread"]
        lines.append(
            f"| {r['method']} | {r['tokens']} | {r['wall_s']:.2f} | {r['tokens_per_s']:.1f}"
            f"{rounds(r.get('round_tokens_per_s'), '.1f')} | "
            f"{num(r.get('vs_generate_batch'), '.2f', 'x')}"
            f"{rounds(r.get('vs_generate_batch_rounds'), '.2f', 'x')} | "
            f"{num(r.get('vs_static'), '.2f', 'x')}"
            f"{rounds(r.get('vs_static_rounds'), '.2f', 'x')} | "
            f"{r['rss_mib']:.0f}{'*' if r.get('shared_process') else ''} | "
            f"{num(r['load_s'], '.1f')} | {num(r.get('setup_s'), '.1f')} | "
            f"{d['min']} / {d['median']:g} / {d['max']} ({d['at_cap']}) | "
            f"{num(r.get('mean_accepted'), '.2f')} |"
        )
    return lines


def to_markdown(meta: dict, rows: list[dict], mismatches: dict, extra: dict) -> str:
    cap = meta["max_new_tokens"]
    out = header("Continuous batching: one many-prompt job, side by side", meta)
    out += [
        "",
        f"Setup: {meta['setup']}; {meta['prompts']} prompts, greedy, at most {cap} new tokens "
        f"a row, each row ending at eos; {meta['rows']} rows at once; prompts in "
        f"{ORDERS.get(meta.get('order'), 'the given order')}; "
        f"{meta.get('rounds', 1)} round(s), each method once a round, in an order rotated by "
        "one each round; wall s, tokens/s and ratios: the median of the rounds', each round's "
        "in brackets (a ratio compares two methods of the same round). Each method ran in its "
        "own process (peak RSS: that process's; `*`: methods sharing one process, the smoke "
        "run's). tokens/s: new tokens over the generation's wall time (model load, bass's "
        "CPU setup and a warm-up generation of one prompt and two tokens excluded; `cli`: "
        "the whole command's wall time, model load included; `cli (its summary)`: the "
        "tokens and seconds its summary printed, its generation alone). Ratios: tokens/s "
        "over generate_batch's, and over bass's static chunks "
        "with the same drafting (`-off`: drafting off; the others: n-gram, default policy). "
        "The GGUF conversion and bass's CPU linear calibration are read from their caches on "
        "disk (`$BASS_GGUF_CACHE`, `$BASS_CPU_LINEAR_CACHE`) once a process made them, as "
        "on every run after a machine's first.",
        "",
        *table(rows, cap),
        "",
    ]
    if "(smoke)" in meta["setup"]:
        out += [
            "Smoke run: its timings mean nothing (the CLI ran beside the other process, one "
            "torch thread each).",
            "",
        ]
    if "cli" in extra:
        c = extra["cli"]
        said = []
        for k, (wall, p) in enumerate(zip(c["wall_s"], c["printed"]), 1):
            text = f"round {k}: {wall:.1f} s for the whole command, "
            if p:
                text += f"it printed {p['tokens']} tokens in {p['seconds']:.2f} s"
                text += f" ({p['tokens_per_s']:.1f} tokens/s)"
            else:
                text += "no summary line found"
            said.append(text)
        out += [f"`cli`: `{c['command']}`: {'; '.join(said)}.", ""]
    if GB in extra:
        s = extra[GB]
        out += [
            "`transformers-generate_batch` settings: `generation_config` "
            f"{json.dumps(s['generation_config'])}, `continuous_batching_config` "
            f"{json.dumps(s['continuous_batching_config'])}; {s['other']}.",
            "",
        ]
    if "skipped" in extra:
        out += [f"Skipped: {why}" for why in extra["skipped"]] + [""]
    out += ["## Are the outputs equal?", ""]
    if not mismatches:
        out += [f"Not checked ({REFERENCE} did not run).", ""]
    for m, bad in mismatches.items():
        what = "token for token" if m != "cli" else "text and token count"
        if not bad:
            out.append(f"- {m}: all {meta['prompts']} rows equal {REFERENCE}'s ({what}).")
        elif m == GB:
            out.append(
                f"- {m}: {len(bad)} of {meta['prompts']} rows differ from {REFERENCE}'s "
                f"(prompts {bad[:12]}{'...' if len(bad) > 12 else ''}; another "
                "implementation: float rounding may differ)."
            )
        else:
            out.append(
                f"- **MISMATCH** {m}: {len(bad)} of {meta['prompts']} rows differ from "
                f"{REFERENCE}'s ({what}; prompts {bad[:12]}): greedy bass output should "
                "not depend on the batching."
            )
    return "\n".join(out) + "\n"

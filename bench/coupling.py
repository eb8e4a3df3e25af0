"""How often a sampled draft token is accepted, by the way it is verified: rejection sampling
against coupled draws (the draft and the main model drawing with the same keyed noise).

For each position of text the main model samples, with ``p`` the main model's warped
distribution and ``q`` the draft's, the probability that the draft's token is accepted is
computed exactly (no sampling noise):

* ``rejection``: Leviathan et al.'s rule, ``sum_x min(p(x), q(x))`` (the best any
  verification can do for one token). The output is the main model's distribution, but
  which sample comes out depends on the draws spent on drafts, so on the draft lengths.
* ``inverse-cdf``: the draft and the main model each draw by inverse-CDF sampling with
  the same uniform ``u`` (bass's keyed draw, :func:`bass.sampling.sample_keyed`); the
  token is accepted when they agree: ``sum_x |[P(x-), P(x)] & [Q(x-), Q(x)]|``. The
  output is the main model's own keyed draw: the same samples whatever the drafter,
  the policy or the batch.
* ``gumbel``: both take ``argmax(log w + G)`` with the same Gumbel noise ``G`` per token
  (Gumbel-max coupling); agreement ``sum_x 1 / sum_y max(p(y)/p(x), q(y)/q(x))``,
  summed here over the 32 tokens of largest ``min(p, q)`` (a lower bound; the rest can
  add at most their ``min(p, q)``, reported as ``gumbel_gap``). Same promise as
  inverse-cdf, but a draw needs noise for every token of the vocabulary.

Drafts of the embedded SmolLM2-135M: the same model with relative Gaussian noise on its
linear layers' weights (a range of draft quality; no second model ships here). ``--tiny``:
a random pair, in seconds (the smoke test).

    python bench/coupling.py                     # -> results/cpu_coupling.{md,json}
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import header, run_meta
from _prompts import CHAT, humaneval_prompts, tiny_llama

from bass.sampling import SamplingParams, warp_probs

CANDIDATES = 32  # tokens summed exactly in the Gumbel-max agreement
BLOCKS = (16, 64, 256)  # block sizes of the blocked Gumbel-max draws


def agreement(p: torch.Tensor, q: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position acceptance of a draft token, each way (``p``, ``q``: float64 ``[n, V]``)."""
    rej = torch.minimum(p, q).sum(-1)
    P, Q = p.cumsum(-1), q.cumsum(-1)
    P0, Q0 = P - p, Q - q
    icdf = (torch.minimum(P, Q) - torch.maximum(P0, Q0)).clamp_min(0).sum(-1)
    m = torch.minimum(p, q)
    top = torch.topk(m, min(CANDIDATES, p.shape[-1]), dim=-1).indices  # [n, J]
    pj, qj = p.gather(-1, top), q.gather(-1, top)  # [n, J]
    gum = torch.zeros_like(rej)
    for c in range(top.shape[1]):  # [n, V] at a time
        a, b = pj[:, c : c + 1], qj[:, c : c + 1]
        ok = (a > 0) & (b > 0)
        ratio = torch.maximum(p / a.clamp_min(1e-300), q / b.clamp_min(1e-300)).sum(-1)
        gum += torch.where(ok.squeeze(1), 1 / ratio, torch.zeros_like(ratio))
    gap = (m.sum(-1) - m.gather(-1, top).sum(-1)).clamp_min(0)
    out = {"rejection": rej, "inverse-cdf": icdf, "gumbel": gum, "gumbel_gap": gap}
    for b in BLOCKS:
        out[f"block-{b}"] = block_agreement(p, q, b)
    return out


def block_agreement(p: torch.Tensor, q: torch.Tensor, b: int) -> torch.Tensor:
    """Agreement of blocked Gumbel-max draws (the vocabulary in blocks of ``b`` tokens; an
    exponential race over the blocks' masses with one keyed noise per block, then
    inverse-CDF within the winning block with one more keyed uniform): ``sum_c g_c *
    i_c``, ``g_c`` the Gumbel-max agreement on block ``c`` of the block masses and ``i_c``
    the inverse-CDF agreement of the two distributions within it."""
    n, V = p.shape
    pad = -V % b
    if pad:
        p, q = torch.nn.functional.pad(p, (0, pad)), torch.nn.functional.pad(q, (0, pad))
    pb, qb = p.view(n, -1, b), q.view(n, -1, b)  # [n, C, b]
    P, Q = pb.sum(-1), qb.sum(-1)  # [n, C]
    ok = (P > 0) & (Q > 0)
    ratio = torch.stack(
        [  # one position at a time: [C, C]
            torch.maximum(
                P[i, None, :] / P[i, :, None].clamp_min(1e-300),
                Q[i, None, :] / Q[i, :, None].clamp_min(1e-300),
            ).sum(-1)
            for i in range(n)
        ]
    )  # [n, C]: sum over e of max(P_e/P_c, Q_e/Q_c)
    g = torch.where(ok, 1 / ratio, torch.zeros_like(ratio))
    pn, qn = pb / P[..., None].clamp_min(1e-300), qb / Q[..., None].clamp_min(1e-300)
    Pc, Qc = pn.cumsum(-1), qn.cumsum(-1)
    inner = (torch.minimum(Pc, Qc) - torch.maximum(Pc - pn, Qc - qn)).clamp_min(0).sum(-1)
    return (g * inner).sum(-1)


def noisy(model, rel: float, seed: int = 1):
    """``model`` with Gaussian noise of ``rel`` times each linear weight's std added."""
    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in d.modules():
            if isinstance(m, torch.nn.Linear):
                w = m.weight
                w.add_(torch.randn(w.shape, generator=g, dtype=w.dtype) * w.std() * rel)
    return d


def expected_accepted(alpha: float, k: int) -> float:
    """Mean accepted drafts of ``k`` at a per-token acceptance ``alpha`` (independent)."""
    return sum(alpha**i for i in range(1, k + 1))


def measure(main, drafts, prompts, settings, new_tokens, seed=0) -> list[dict]:
    rows = []
    torch.manual_seed(seed)
    seqs = []  # the positions: the main model's own samples (at each setting's warping)
    for params in settings:
        texts = []
        for ids in prompts:
            with torch.no_grad():
                out = main.generate(
                    torch.tensor([ids]),
                    max_new_tokens=new_tokens,
                    do_sample=True,
                    temperature=params.temperature,
                    top_p=params.top_p or 1.0,
                    top_k=0,
                    pad_token_id=0,
                )
            texts.append((len(ids), out))
        seqs.append(texts)
    for name, draft in drafts.items():
        for params, texts in zip(settings, seqs):
            acc: dict[str, list] = {}
            for start, out in texts:
                with torch.no_grad():
                    lp = main(out).logits[0, start - 1 : -1].double()
                    lq = draft(out).logits[0, start - 1 : -1].double()
                got = agreement(warp_probs(lp, params), warp_probs(lq, params))
                for k, v in got.items():
                    acc.setdefault(k, []).append(v)
            means = {k: torch.cat(v).mean().item() for k, v in acc.items()}
            rows.append(
                {
                    "draft": name,
                    "temperature": params.temperature,
                    "top_p": params.top_p,
                    "positions": sum(len(v) for v in acc["rejection"]),
                    **means,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def report(rows, meta) -> str:
    lines = [
        *header("Accepting sampled drafts: rejection sampling against coupled draws", meta),
        "",
        "Per-token acceptance probability of a draft token (exact, averaged over the "
        "positions of text the main model sampled; method: bench/coupling.py's docstring). "
        "E[accepted | k=4]: the mean accepted drafts of 4 at that rate (tokens independent).",
        "",
        "| draft | temperature | top_p | positions | rejection | inverse-cdf | gumbel (>=) "
        "| inverse-cdf / rejection | gumbel / rejection | E[acc|4] rejection | inverse-cdf "
        "| gumbel |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a, b, c = r["rejection"], r["inverse-cdf"], r["gumbel"]
        e = [expected_accepted(x, 4) for x in (a, b, c)]
        lines.append(
            f"| {r['draft']} | {r['temperature']} | {r['top_p'] or '-'} | {r['positions']} | "
            f"{a:.3f} | {b:.3f} | {c:.3f} | {b / a:.2f} | {c / a:.2f} | "
            f"{e[0]:.2f} | {e[1]:.2f} | {e[2]:.2f} |"
        )
    gap = max(r["gumbel_gap"] for r in rows)
    lines += ["", f"gumbel is a lower bound: at most {gap:.4f} more on any row."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a random tiny pair (smoke test)")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--out", default=None, help="output stem (default results/cpu_coupling)")
    args = ap.parse_args(argv)
    settings = [
        SamplingParams(True, 0.7),
        SamplingParams(True, 1.0),
        SamplingParams(True, 1.0, top_p=0.95),
    ]
    if args.tiny:
        main_model = tiny_llama(vocab_size=64, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2)  # fmt: skip
        drafts = {"noise 0.5": noisy(main_model, 0.5)}
        prompts = [[1, 2, 3], [4, 5, 6, 7]]
        args.new_tokens = 4
    else:
        from bass.models import encode_prompt, load_default_pair

        main_model, tok = load_default_pair()
        drafts = {f"noise {rel}": noisy(main_model, rel) for rel in (0.05, 0.1, 0.2)}
        prompts = [encode_prompt(tok, t, True) for t in CHAT]
        prompts += humaneval_prompts(tok, 4)
    rows = measure(main_model, drafts, prompts, settings, args.new_tokens)
    meta = run_meta("coupling.py", argv if argv is not None else sys.argv[1:])
    text = report(rows, meta)
    print(text)
    if args.out or not args.tiny:
        stem = Path(args.out or Path(__file__).parent / "results" / "cpu_coupling")
        stem.with_suffix(".md").write_text(text)
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

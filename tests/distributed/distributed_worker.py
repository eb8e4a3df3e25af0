"""One rank of the torch.distributed tests (tests/distributed/test_distributed.py), run by torchrun.

``python -m torch.distributed.run --nproc-per-node 2 tests/distributed/distributed_worker.py
SPEC OUT``:
SPEC is a JSON file ``{"mode": "tp"|"dp", "tp": int, "main": dir, "draft": dir|null,
"timeout": seconds, "cases": [{"name", "draft", "policy", "generate": {...}, "fail_rank",
"prompts_by_rank", "slow_rank": [rank, seconds a step] (policy "slow")}], "no_init": bool}``;
every rank writes its results to ``OUT/rank<r>.json`` (``{case name: {"sequences", "reasons"} or
{"error": message}}``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

import bass
from bass import distributed
from bass.models import load_tensor_parallel
from bass.policies import Policy


class FailingPolicy(Policy):
    """Raises at its third decision on one rank: a rank that fails mid-generation."""

    def __init__(self, rank: int):
        self.rank, self.calls = rank, 0

    def draft_length(self) -> int:
        self.calls += 1
        if self.calls == 3 and distributed.topology().rank == self.rank:
            raise RuntimeError(f"policy failure injected on rank {self.rank}")
        return 2


class SlowPolicy(Policy):
    """Drafts 2 tokens a step, pausing ``pause`` seconds at each decision on rank ``rank``."""

    def __init__(self, rank: int, pause: float):
        self.rank, self.pause = rank, pause

    def draft_length(self) -> int:
        if distributed.topology().rank == self.rank:
            time.sleep(self.pause)
        return 2


def main(spec_path: str, out_dir: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("no_init"):  # bass.distributed.generate initialises the process group
        rank = int(os.environ["RANK"])
    else:
        rank = distributed.init(tp=spec["tp"], timeout=spec.get("timeout", 60)).rank
    dtype = torch.float64
    if spec["mode"] == "tp":
        main_model = load_tensor_parallel(spec["main"], spec["tp"], dtype=dtype)
    else:
        main_model = bass.load_causal_lm(spec["main"], dtype=dtype)
    draft_model = bass.load_causal_lm(spec["draft"], dtype=dtype) if spec.get("draft") else None
    results = {}
    for case in spec["cases"]:
        draft = {"model": draft_model, "ngram": "ngram", None: None}[case.get("draft")]
        policy = case.get("policy", "constant")
        if policy == "failing":
            policy = FailingPolicy(case["fail_rank"])
        if policy == "slow":  # a group that finishes its share later than the others
            policy = SlowPolicy(*case["slow_rank"])
        gen = bass.Generator(main_model, draft, policy=policy, cpu_linear="torch")
        prompts = case.get("prompts_by_rank", {}).get(str(rank), case.get("prompts"))
        if case.get("as_tensors"):  # 1-D tensors, as a tokenizer's return_tensors gives
            prompts = [torch.tensor(p) for p in prompts]
        kw = dict(case.get("generate", {}))
        finished = []
        if case.get("on_finish"):  # a closure: it does not pickle
            kw["on_finish"] = lambda row, seen=finished: seen.append(row.prompt)
        try:
            if spec["mode"] == "dp":
                res = distributed.generate(gen, prompts, **kw)
            else:
                res = gen.generate(prompts, **kw)
            if res is None:
                results[case["name"]] = {"finished": finished} if finished else None
            else:
                results[case["name"]] = {
                    "sequences": res.sequences,
                    "reasons": res.finish_reasons,
                    "ranks": res.ranks,
                    "logprobs": res.logprobs,
                    "prompt_logprobs": res.prompt_logprobs,
                    "stopped_by_time": res.stats.stopped_by_time_budget if res.stats else None,
                    "finished": finished,
                }
        except Exception as exc:  # recorded: the test checks every rank saw the error
            results[case["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
            if case.get("reraise"):
                Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
                traceback.print_exc()
                raise
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

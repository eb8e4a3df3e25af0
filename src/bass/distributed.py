"""Scale-out on ``torch.distributed``: tensor-parallel main models and data-parallel jobs,
launched with ``torchrun`` (the grid ``world = dp x tp``, what keeps the ranks together
and how to launch: docs/guides/scale-out.md).

A TP group's host decisions are taken by its first rank and shared on a gloo group
(:class:`Coordinator`); :func:`shard` and :func:`gather` split the prompts over the
data-parallel groups and bring the results back to rank 0 in order.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import compat

__all__ = [
    "Coordinator",
    "DistributedError",
    "Topology",
    "check_tp_size",
    "gather",
    "generate",
    "init",
    "launched",
    "shard",
    "topology",
]

DEFAULT_TIMEOUT = 600.0  # seconds a collective may wait for another rank
# a job's end, where a group that finished its share waits for the slowest: as long as
# that one runs (a rank that fails closes its gloo connections, and torchrun ends the rest)
FINISH_TIMEOUT = 7 * 24 * 3600.0


class DistributedError(RuntimeError):
    """Ranks disagree (different prompts or settings), a rank failed, or the launch is
    inconsistent (a TP size that does not divide the world or the model's heads)."""


@dataclass(frozen=True)
class Topology:
    """``world = dp x tp``; this process is ``rank``."""

    world: int
    rank: int
    tp: int

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def dp_rank(self) -> int:
        """Which data-parallel group (its share of the prompts) this rank belongs to."""
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_main(self) -> bool:
        """Rank 0: prints progress and the summary, writes the results."""
        return self.rank == 0


def launched() -> bool:
    """Whether this process runs under ``torchrun`` with more than one rank (or a
    process group is already initialised)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


_TOPOLOGY: Topology | None = None
_CONTROL: dict[tuple[int, ...] | str, object] = {}  # ranks (or "finish") -> a gloo group


def init(tp: int = 1, *, timeout: float = DEFAULT_TIMEOUT) -> Topology:
    """Initialise the default process group from ``torchrun``'s environment (NCCL with
    CUDA, gloo on CPUs; reused when already initialised) and bass's CPU groups for host
    decisions; returns the :class:`Topology`. ``tp`` must divide the world size."""
    global _TOPOLOGY
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise DistributedError(f"the tensor-parallel size must be an int >= 1, got {tp!r}")
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise DistributedError(
                "torch.distributed is not initialised and RANK/WORLD_SIZE are not set: "
                "launch with `torchrun --nproc-per-node N ...`"
            )
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        # ours to close: a process group left open aborts the interpreter at exit (gloo)
        atexit.register(_shutdown)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % tp:
        raise DistributedError(
            f"--tp {tp} does not divide the world size {world}: launch a multiple of {tp} "
            "ranks (world = data-parallel size x tp)"
        )
    _TOPOLOGY = Topology(world, rank, tp)
    _control_groups(tp, timeout)
    return _TOPOLOGY


def _shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    _CONTROL.clear()


def topology() -> Topology:
    """The topology :func:`init` set up (one rank, ``tp = 1``, when it was not called)."""
    if _TOPOLOGY is not None:
        return _TOPOLOGY
    if dist.is_available() and dist.is_initialized():
        return Topology(dist.get_world_size(), dist.get_rank(), 1)
    return Topology(1, 0, 1)


def _control_groups(tp: int, timeout: float = DEFAULT_TIMEOUT) -> None:
    """A gloo group per TP group and one over the world, created by every rank in the
    same order (``new_group`` is collective)."""
    world = dist.get_world_size()
    wanted = [tuple(range(g, g + tp)) for g in range(0, world, tp)] + [tuple(range(world))]
    for ranks in wanted:
        if ranks not in _CONTROL:
            t = datetime.timedelta(seconds=timeout)
            _CONTROL[ranks] = dist.new_group(list(ranks), backend="gloo", timeout=t)
    if "finish" not in _CONTROL:
        t = datetime.timedelta(seconds=max(timeout, FINISH_TIMEOUT))
        _CONTROL["finish"] = dist.new_group(list(range(world)), backend="gloo", timeout=t)


def control_group(ranks: Sequence[int] | str):
    """bass's gloo group over ``ranks`` (a TP group, or the whole world), or ``"finish"``:
    the world's, for a job's end (:data:`FINISH_TIMEOUT`: groups finish at their own
    pace)."""
    key = ranks if isinstance(ranks, str) else tuple(ranks)
    if key not in _CONTROL:
        tp = len(key) if len(key) < dist.get_world_size() and key != "finish" else topology().tp
        _control_groups(tp)
    return _CONTROL[key]


def check_tp_size(config, tp: int, name: str = "the main model") -> None:
    """Refuse, before loading, a TP size that does not divide the model's KV heads (or
    its attention heads), naming both numbers, and a model family transformers has no
    tensor-parallel plan for (``config.base_model_tp_plan``)."""
    if tp == 1:
        return
    text = config.get_text_config()
    if not getattr(text, "base_model_tp_plan", None):
        family = getattr(text, "model_type", type(text).__name__)
        raise DistributedError(
            f"--tp {tp}: {name} is a {family!r} model, and transformers has no tensor-parallel "
            "plan for that family (its config has no base_model_tp_plan); run it without "
            "--tp (data parallel: each rank holds the whole model), or choose a family "
            "transformers can shard (Llama, Mistral, Qwen2/3, Gemma, Phi-3, ...)"
        )
    heads = getattr(text, "num_attention_heads", None)
    kv = compat.kv_heads(text) if heads is not None else None
    for what, n in (("key/value heads", kv), ("attention heads", heads)):
        if n is not None and n % tp:
            raise DistributedError(
                f"--tp {tp} does not divide {name}'s {n} {what}: each rank must hold whole "
                f"heads; use a tensor-parallel size that divides {n}"
            )


class Solo:
    """The host decisions of a model that is not sharded: every method the identity, so
    the engine's loop is the same in one process and in a tensor-parallel group."""

    def share(self, values: Sequence[int]) -> list[int]:
        return list(values)

    def share_mask(self, keep: torch.Tensor) -> torch.Tensor:
        return keep

    def agree_generation(self, prompts, settings: dict, row_ids) -> None:
        pass


#: The settings of a ``generate`` call every rank of a group must agree on, beside the eos
#: ids, the stop sequences and the row ids (every ``[generation]`` option: a test checks).
AGREED = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p", "seed")
AGREED += ("repetition_penalty", "frequency_penalty", "presence_penalty", "time_budget")
AGREED += ("stop_strings", "logprobs", "prompt_logprobs")


class Coordinator(Solo):
    """One TP group's host decisions, on the group's gloo group: its first rank decides,
    the others follow (docs/guides/scale-out.md, "What keeps the ranks together")."""

    def __init__(self, ranks: Sequence[int]):
        self.ranks = list(ranks)
        self.leader = self.ranks[0]
        self.group = control_group(self.ranks)

    def share(self, values: Sequence[int]) -> list[int]:
        """The leader's ``values`` on every rank (every rank passes as many)."""
        t = torch.tensor(list(values), dtype=torch.int64)
        dist.broadcast(t, self.leader, group=self.group)
        return t.tolist()

    def share_mask(self, keep: torch.Tensor) -> torch.Tensor:
        """A per-row early stop decided by the leader (bool ``[R']``), on every rank."""
        host = keep.to("cpu", torch.int64, copy=True)  # the broadcast writes into it
        dist.broadcast(host, self.leader, group=self.group)
        return host.bool().to(keep.device)

    def agree_generation(self, prompts, settings: dict, row_ids) -> None:
        """:meth:`agree` on one ``generate`` call's prompts and checked settings."""
        payload = [settings.get(k) for k in AGREED]
        payload += [sorted(settings["eos_token_id"]), settings["stop_sequences"], row_ids]
        self.agree("prompts and settings", (prompts, payload))

    def agree(self, what: str, payload) -> None:
        """Every rank of the group must pass an equal ``payload`` (:func:`digest`)."""
        seen: list = [None] * len(self.ranks)
        dist.all_gather_object(seen, digest(payload), group=self.group)
        differ = [r for r, d in zip(self.ranks, seen) if d != seen[0]]
        if differ:
            raise DistributedError(
                f"ranks {self.ranks} got different {what}: ranks {differ} differ from rank "
                f"{self.ranks[0]}; every rank must call generate with the same prompts and "
                "settings"
            )


def digest(value) -> str:
    """What ranks compare to agree on ``value``: a hash of its JSON form (objects that
    have none by ``repr``)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def coordinator_for(model: torch.nn.Module) -> Solo:
    """The :class:`Coordinator` of ``model``'s TP group, or a :class:`Solo` one (that
    does nothing) when it is not sharded."""
    group = compat.tp_group(model) if dist.is_available() and dist.is_initialized() else None
    if group is None:
        return Solo()
    return Coordinator(dist.get_process_group_ranks(group))


# --------------------------------------------------------------------------- data parallel


def shard(n: int, topo: Topology | None = None) -> list[int]:
    """The indices of ``n`` prompts this rank's data-parallel group generates: a
    contiguous block, sizes differing by at most one (every rank of a TP group gets the
    same block)."""
    topo = topo or topology()
    base, extra = divmod(n, topo.dp)
    start = topo.dp_rank * base + min(topo.dp_rank, extra)
    return list(range(start, start + base + (topo.dp_rank < extra)))


def gather(local: list, indices: Sequence[int], n: int, topo: Topology | None = None, failed=None):
    """Rank 0: the ``n`` results in the original order (each group's ``local[i]`` is the
    result of prompt ``indices[i]``); ``None`` elsewhere. Only each group's first rank
    contributes (its TP peers hold the same results). ``failed``: what this rank raised
    instead (its message), sent in place of its results: rank 0 then raises a
    :class:`DistributedError` naming every rank that failed and why."""
    topo = topo or topology()
    if topo.world == 1:
        return list(local)
    mine = (
        _Failed(topo.rank, failed)
        if failed is not None
        else (list(zip(indices, local)) if topo.tp_rank == 0 else [])
    )
    parts: list | None = [None] * topo.world if topo.is_main else None
    # to rank 0 only (the other ranks need not hold the whole job), each at its own pace
    dist.gather_object(mine, parts, dst=0, group=control_group("finish"))
    if parts is None:
        return None
    errors = [p for p in parts if isinstance(p, _Failed)]
    if errors:
        said = "; ".join(f"rank {e.rank}: {e.message}" for e in errors)
        raise DistributedError(f"{len(errors)} rank(s) failed their share of the job: {said}")
    out: list = [None] * n
    for part in parts:
        for i, value in part:
            out[i] = value
    return out


class _Failed(NamedTuple):
    rank: int
    message: str


def generate(generator, prompts, **kwargs):
    """Data-parallel :meth:`bass.Generator.generate` under ``torchrun``
    (docs/guides/scale-out.md, "From Python"): each data-parallel group generates its
    share of ``prompts`` (:func:`shard`); rank 0 returns a :class:`bass.GenerationResult`
    of every prompt in order (``stats``: its own share's; ``ranks``: the rank that
    generated each row), the other ranks ``None``. Sampled rows are keyed by their global
    index, as in one process. Every rank must pass the same arguments (checked, after
    each rank checked the whole call as ``generate`` would: a bad argument raises the same
    error on every rank). The process group is initialised (:func:`init`) under
    ``torchrun`` when it was not. A rank whose share fails raises its error; rank 0 raises
    a :class:`DistributedError` naming it (the others return ``None``), and no rank waits
    for it."""
    from .batch_state import NonFiniteLogitsError, PromptError
    from .stats import GenerationResult

    if _TOPOLOGY is None and not dist.is_initialized() and launched():
        init()  # every rank calls this: a collective they all take part in
    topo = topology()
    # the whole call checked on every rank, as generate() checks it (the same error on all)
    job = generator._job(prompts, kwargs)
    prompts, ids = job.prompts, job.row_ids
    if topo.world > 1:  # the checked values (a set of stop strings pickles per process)
        Coordinator(range(topo.world)).agree_generation(prompts, job.kw, ids)
    kwargs.pop("row_ids", None)
    kwargs.pop("n", None)  # job.prompts holds each prompt's n rows, keyed by ids
    kwargs["do_sample"] = job.kw["do_sample"]  # (as checked: said once, above)
    mine = shard(len(prompts), topo)
    theirs = kwargs.get("on_finish")
    if theirs is not None:  # the row's index among the whole call's prompts
        kwargs["on_finish"] = lambda row: theirs(dataclasses.replace(row, prompt=mine[row.prompt]))
    res = error = None
    if mine:
        try:
            res = generator.generate(
                [prompts[i] for i in mine], row_ids=[ids[i] for i in mine], **kwargs
            )
        except (PromptError, NonFiniteLogitsError) as e:  # named by its index in the call
            error = e.at(mine[e.prompt] // (job.kw["n"] or 1))  # (n rows a prompt)
        except Exception as e:  # told to rank 0 at the gather, then raised here
            error = e
    local = []
    if res is not None:
        none = [None] * len(res.sequences)
        lps, plps = res.logprobs or none, res.prompt_logprobs or none
        local = list(zip(res.sequences, res.finish_reasons, lps, plps))
    failed = None if error is None else f"{type(error).__name__}: {error}"
    try:
        rows = gather(local, mine, len(prompts), topo, failed)
    except DistributedError:
        if error is None:
            raise
        rows = None  # this rank's own error is raised below
    if error is not None:
        raise error
    if rows is None:
        return None
    sequences, reasons, lps, plps = (list(c) for c in zip(*rows)) if rows else ([], [], [], [])
    ranks = [None] * len(prompts)
    for r in range(0, topo.world, topo.tp):  # each group's first rank
        for i in shard(len(prompts), Topology(topo.world, r, topo.tp)):
            ranks[i] = r
    stats = None if res is None else res.stats
    lps = lps if job.params.logprobs is not None else None
    plps = plps if job.kw["prompt_logprobs"] else None
    return GenerationResult(sequences, stats, reasons, ranks, lps, plps)

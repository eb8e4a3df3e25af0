"""A Generator's compiled passes (``compile=``): :func:`bass.passes.forward_packed` under
``torch.compile(fullgraph=True)``, a region per model, compiled again when a model's
modules change (docs/guides/performance.md, "Compiling")."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import torch

from . import compat, cpu_linear
from .errors import UnsupportedModelError
from .hf import model_name
from .packing import TOKEN_BUCKETS
from .passes import Passes, forward_packed

# what a failed compile raises: Dynamo's errors (Inductor's are among them) and a guard on
# a data-dependent value (tolist() on routing counts)
_COMPILE_ERRORS = (
    torch._dynamo.exc.TorchDynamoException,
    torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode,
)


def _floats(attrs: dict) -> tuple:
    """The float values of ``attrs`` (a module's ``__dict__``, a config's ``vars``), with the
    float items of its dicts, lists and tuples (a LoRA layer's ``scaling``, a config's
    ``rope_parameters``)."""
    out = []
    for k, v in attrs.items():
        if type(v) is float:
            out.append((k, v))
        elif isinstance(v, (dict, list, tuple)):
            items = v.items() if isinstance(v, dict) else enumerate(v)
            found = tuple((i, x) for i, x in items if type(x) is float)
            if found:
                out.append((k, found))
    return tuple(out)


def _structure(model: torch.nn.Module) -> tuple:
    """What a compiled region whose guards skip ``model``'s modules assumes unchanged: each
    module (its type and identity, a forward set on the instance, bass's CPU routing
    aside, and its training mode: a graph traced in training mode draws dropout, one
    traced in eval mode draws none), each parameter's and buffer's shape, strides, dtype
    and device (Inductor's code asserts the strides it was compiled for), and the floats
    the graph holds as constants (compat shim 11): each module's own (``scaling``,
    ``variance_epsilon``) and those of the configs its modules hold (Gemma 2 reads
    ``config.final_logit_softcapping`` in its forward), sub-configs included. Other ints,
    bools and strings are constants too but are not read: some modules set such
    attributes in their forward (dynamic RoPE's ``max_seq_len_cached``), which would
    recompile at every generation."""
    from transformers import PretrainedConfig

    def own_forward(m):
        f = m.__dict__.get("forward")
        return (
            None
            if f is None
            or getattr(getattr(f, "func", None), "__module__", None) == cpu_linear.__name__
            else id(f)
        )

    modules, configs = [], {}
    for n, m in model.named_modules():
        modules.append((n, type(m), id(m), m.training, own_forward(m), _floats(m.__dict__)))
        configs.update((id(v), v) for v in m.__dict__.values() if isinstance(v, PretrainedConfig))
    for cfg in list(configs.values()):  # one level of sub-configs (text_config, ...)
        configs.update((id(v), v) for v in vars(cfg).values() if isinstance(v, PretrainedConfig))
    tensors = tuple(
        (n, t.shape, t.stride() if t.layout == torch.strided else None, t.dtype, t.device)
        for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
    )
    return tuple(modules), tensors, tuple(_floats(vars(c)) for c in configs.values())


def passes_for(backend, compile, static_shapes, impl: str, chunk_tokens: int):
    """``(Passes, CompiledForward or None)``: how a Generator's packed passes run, decided
    once when it is built (``Generator(compile=, static_shapes=, attention=,
    prefill_chunk_tokens=)``, ``backend`` its device's tuning): the per-step forward
    compiled where asked (N dynamic: docs/concepts/engine.md), the prefill's eager."""
    graphs = compile == "reduce-overhead"
    if static_shapes is None:  # CUDA graphs replay static shapes
        static_shapes = graphs
    region = None
    if compile:
        region = CompiledForward(
            "inductor" if compile in (True, "reduce-overhead") else compile,
            mode="reduce-overhead" if graphs else None,
            dynamic=True,
            limit=4 * len(TOKEN_BUCKETS) + 8,  # a graph per pass kind and bucket, or a few
        )
    passes = Passes(
        forward=backend.wrap(forward_packed if region is None else region),
        eager=backend.wrap(forward_packed),
        compiled=bool(compile),
        impl=impl,
        bucket=TOKEN_BUCKETS if static_shapes else None,
        separate=bool(compile),  # compiled passes take standalone tensors, not views
        logits_multiple=backend.logits_multiple,
        chunk_tokens=chunk_tokens,
    )
    return passes, region


class CompiledForward:
    """:func:`forward_packed` under ``torch.compile(fullgraph=True)``, called like it.

    On torch >= 2.13 each model gets a compiled region of its own (``isolate_recompiles``)
    whose guards skip the model's modules (``skip_guard_on_all_nn_modules_unsafe``): what
    that gains and gives up is in docs/guides/performance.md ("Compiling"). On older torch
    every model shares one region with every guard kept (``limit`` graphs in all).

    ``backend``, ``mode`` (Inductor's) and ``dynamic`` are ``torch.compile``'s; ``limit``:
    the most graphs per region (Dynamo's default of 8 would fail a ``fullgraph`` compile).
    """

    def __init__(self, backend="inductor", *, mode: str | None = None, dynamic=None, limit=8):
        self.backend, self.mode, self.dynamic, self.limit = backend, mode, dynamic, limit
        self._regions: dict[int, tuple[torch.nn.Module, object]] = {}
        self._made_for: dict[int, tuple] = {}  # each region's model's structure
        # a model's Python floats become graph constants, not CPU tensor inputs (compat 11)
        self._config = compat.dynamo_config(None if compat.PER_MODEL_COMPILE else limit)

    def check(self, models: Sequence[torch.nn.Module]) -> None:
        """A generation starts: a model whose modules were replaced since its region was
        compiled (``resize_token_embeddings``, an adapter, a swapped activation) or that
        was switched between training and eval mode (dropout drawn or not) would run the
        old graph, whose guards skip its modules, and one whose weights were replaced
        by tensors of other strides (``load_state_dict(assign=True)``) would fail
        Inductor's layout asserts, and one whose float settings changed (a LoRA scale, a
        norm's epsilon, a config's float) would run the old ones, constants of its graph:
        its region is dropped (compiled again at its next pass), with a warning, as that
        costs a compile."""
        for model in models:
            made = self._made_for.get(id(model))
            if made is not None and made != _structure(model):
                del self._regions[id(model)], self._made_for[id(model)]
                warnings.warn(
                    f"{model_name(model)}'s modules, its training mode (model.train(), "
                    "model.eval()), its float settings (a LoRA scale, a norm's epsilon, a "
                    "config's float), or its weights' shapes or memory layouts changed "
                    "since its compiled forward was made: compiling it again (replace no "
                    "module or weight between generations of a compiled Generator to avoid "
                    "the cost, change weights in place, and generate in one mode; a changed "
                    "float setting always costs a compile)",
                    UserWarning,
                    stacklevel=4,
                )

    def _compile(self):
        compat.import_inductor_quietly()
        kw = dict(backend=self.backend, fullgraph=True, dynamic=self.dynamic)
        if not compat.PER_MODEL_COMPILE:
            return torch.compile(forward_packed, mode=self.mode, **kw)
        options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
        if self.mode is not None:  # torch.compile takes a mode or options, not both
            from torch._inductor import list_mode_options

            options.update(list_mode_options(self.mode, self.dynamic))
        kw.update(options=options, recompile_limit=self.limit, isolate_recompiles=True)
        return torch.compile(forward_packed, **kw)

    def __call__(self, model, *args):
        entry = self._regions.get(id(model))
        if entry is None or entry[0] is not model:
            entry = self._regions[id(model)] = (model, self._compile())
            self._made_for[id(model)] = _structure(model)
        try:
            with torch._dynamo.config.patch(**self._config):
                return entry[1](model, *args)
        except _COMPILE_ERRORS as exc:  # e.g. data-dependent shapes (MoE routing by counts)
            first = (str(exc).strip().splitlines() or [""])[0]
            if any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
                raise UnsupportedModelError(  # a float32 model under bf16 autocast: its keys
                    # and values come out in two dtypes, which the cache's appends refuse
                    f"torch.compile could not compile {model_name(model)}'s forward under "
                    f"torch.autocast ({type(exc).__name__}: {first}): generate outside the "
                    "autocast block, cast the model to autocast's dtype instead, or generate "
                    "without compile= (eager passes follow autocast)"
                ) from exc
            raise UnsupportedModelError(
                f"torch.compile (fullgraph) could not compile {model_name(model)}'s forward "
                f"({type(exc).__name__}: {first}); {_own_attention(args)}generate without "
                "compile= (eager passes)"
            ) from exc


def _own_attention(args) -> str:
    """A hint when the pass traced an attention implementation registered outside bass
    (``traceable`` defaults to True; a ``run`` reading lengths on the host cannot be)."""
    impl = getattr(args[-1], "impl", None)  # forward_packed's plan
    module = getattr(getattr(impl, "run", None), "__module__", None) or ""
    if not getattr(impl, "traceable", False) or module.startswith("bass."):
        return ""
    return (
        f"the attention implementation {impl.name!r} was traced into the graph (if the "
        "error is in it: register it with traceable=False, compiled passes then call it "
        "through the op, or pick another attention=), or "
    )

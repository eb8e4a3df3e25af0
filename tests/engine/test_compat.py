"""bass.compat: the transformers shims, and the guard that makes a deprecation raised
about a bass call a test failure."""

from __future__ import annotations

import warnings
from pathlib import Path

import deprecation_guard
import pytest
import torch
import transformers
from models import perturbed, tiny_lm

import bass
from bass import compat
from bass.cache import RaggedKVCache


def _run_as(path: Path, source: str, namespace: dict):
    """Execute ``source`` as if it were the file ``path`` (the guard decides by file)."""
    exec(compile(source, str(path), "exec"), namespace)


def _fake_stack(caller_dir: Path):
    """A deprecated "transformers" function and a caller living in ``caller_dir``."""
    ns = {"warnings": warnings}
    dep = Path(transformers.__file__).parent / "_bass_test_deprecated.py"
    _run_as(
        dep,
        "def deprecated():\n    warnings.warn('`x` is deprecated', FutureWarning, stacklevel=2)\n",
        ns,
    )
    _run_as(caller_dir / "_bass_test_caller.py", "def call():\n    deprecated()\n", ns)
    return ns["call"]


def test_guard_flags_a_deprecation_called_from_bass():
    call = _fake_stack(Path(bass.__file__).parent)
    with deprecation_guard.watch() as seen, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call()
    assert len(seen) == 1
    assert "_bass_test_caller.py:2" in seen[0].call_site
    assert "is deprecated" in deprecation_guard.report(seen)


def test_guard_leaves_a_deprecation_called_from_a_test_alone():
    call = _fake_stack(Path(__file__).parent)
    with deprecation_guard.watch() as seen, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call()
    assert seen == []


def test_guard_flags_a_logged_deprecation_called_from_bass():
    ns = {"logging": __import__("logging")}
    dep = Path(transformers.__file__).parent / "_bass_test_logged.py"
    _run_as(
        dep,
        "def deprecated():\n"
        "    logging.getLogger('transformers.x').warning('`y` is deprecated, use `z`')\n",
        ns,
    )
    _run_as(
        Path(bass.__file__).parent / "_bass_test_caller.py", "def call():\n    deprecated()\n", ns
    )
    with deprecation_guard.watch() as seen:
        ns["call"]()
    assert [d.message for d in seen] == ["`y` is deprecated, use `z`"]


class _NewStyle(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, **kwargs): ...


class _OldStyle(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, **kwargs): ...


def test_cache_argument_follows_the_signature():
    assert compat.cache_argument(_NewStyle()) == "cache"
    assert compat.cache_argument(_OldStyle()) == "past_key_values"
    assert compat.forward_cache_kwargs(_OldStyle(), 7) == {"past_key_values": 7}


def test_cache_argument_of_this_transformers_llama():
    import inspect

    model = tiny_lm()
    params = inspect.signature(type(model).forward).parameters
    expected = "cache" if "cache" in params else "past_key_values"
    assert compat.cache_argument(model) == expected


@pytest.mark.parametrize(
    "extras",
    [
        ((), {}),
        (({"cache_position": None},), {}),  # transformers <= 5.23: a positional dict
        ((), {"kwargs": {"position_ids": None}}),  # >= 5.24: kwargs=kwargs
        ((), {"cache_kwargs": None}),
    ],
)
def test_cache_update_takes_what_any_version_passes(extras):
    args, kwargs = extras
    cache = RaggedKVCache(2, 8, 1, torch.device("cpu"))
    cache.begin(torch.tensor([1, 1], dtype=torch.int32))
    k = torch.randn(2, 1, 1, 4)
    keys, _ = cache.update(k, k.clone(), 0, *args, **kwargs)
    assert keys.shape == (2, 1, 8, 4)
    torch.testing.assert_close(keys[:, :, :1], k)


def test_generation_raises_no_deprecation_at_all():
    """Greedy and sampled generation, n-gram and draft model, with every warning shown:
    transformers raises no deprecation warning during a bass generation (the guard in
    conftest checks call sites in every test; this checks there is none at all)."""
    main = tiny_lm(seed=3)
    draft = perturbed(main)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for d in ("ngram", draft, None):
            gen = bass.Generator(main, d, policy="constant", cpu_linear="torch")
            gen.generate([[1, 2, 3, 1, 2], [4, 5]], max_new_tokens=6)
            gen.generate([[1, 2, 3]], max_new_tokens=6, do_sample=True, seed=0)
    deprecations = [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in caught
        if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning))
    ]
    assert deprecations == []


def test_inductors_first_import_warns_nothing_through_bass():
    """Shim 6, in a fresh interpreter (this one has imported Inductor already): with every
    DeprecationWarning an error, bass's quiet import and then what Inductor's first compile
    imports (torch.utils.mkldnn, whose import warns) raise nothing."""
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "from bass import compat; compat.import_inductor_quietly()\n"
        "import torch._inductor.fx_passes.post_grad\n"
        "print('quiet')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "quiet" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("show", [False, True])
def test_loading_bars_silence_the_gguf_conversion_bar_too(show):
    """Shim 10: with bars off, transformers' switch is off and the GGUF module's own
    ``tqdm`` (it ignores the switch) makes silent bars; both restored afterwards."""
    from transformers import modeling_gguf_pytorch_utils as gguf
    from transformers.utils import logging as hf_logging

    before = gguf.tqdm
    with compat.loading_bars(show):
        assert hf_logging.is_progress_bar_enabled() is show
        bar = gguf.tqdm(range(3), desc="converting")
        assert bar.disable is not show
        bar.close()
    assert gguf.tqdm is before and hf_logging.is_progress_bar_enabled()

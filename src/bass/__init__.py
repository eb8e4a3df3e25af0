"""bass: batched speculative decoding with ragged attention as PyTorch custom ops.

``import bass`` registers the ops (:mod:`bass.ops`) and loads the option declarations and
the config file's reader (:mod:`bass.config`), nothing heavier: the engine and its
transformers integration load on first use of :class:`Generator` and friends.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import config, ops  # noqa: F401  (config: installs the reader of config=)

#: The version (``bass --version``; pyproject reads it from here). The distribution on the
#: package index is ``bass-decoding``: ``bass`` there is an unrelated project.
__version__ = "0.1.0"

_LAZY = {
    "Generator": "bass.engine",
    "NonFiniteLogitsError": "bass.engine",
    "FinishedRow": "bass.stats",
    "GenerationResult": "bass.stats",
    "GenerationStats": "bass.stats",
    "SamplingParams": "bass.sampling",
    "RaggedKVCache": "bass.cache",
    "load_default_pair": "bass.models",
    "load_causal_lm": "bass.models",
}

__all__ = ["__version__", "ops", *_LAZY]

if TYPE_CHECKING:  # names for type checkers and IDEs; loaded lazily at run time
    from .cache import RaggedKVCache  # noqa: F401
    from .engine import Generator, NonFiniteLogitsError  # noqa: F401
    from .models import load_causal_lm, load_default_pair  # noqa: F401
    from .sampling import SamplingParams  # noqa: F401
    from .stats import FinishedRow, GenerationResult, GenerationStats  # noqa: F401


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bass' has no attribute {name!r}")

"""Every point where bass meets a transformers API that differs across the versions
``pyproject.toml`` admits, in one place.

Each shim detects the feature (a parameter in a signature, an attribute), never a version
string, and says which versions need it and when it can go. CI runs the default suite on
the newest transformers and the equivalence and op suites on the oldest one pyproject
admits (``nox -s tests_floor``); a deprecation warning that transformers raises about a
call bass made fails the tests (``tests/conftest.py``), so the next rename shows up here
before a user meets it.

The shims:

1. **The forward's cache argument** (:func:`cache_argument`): ``past_key_values=`` up to
   transformers 5.23; 5.24 renamed it ``cache=`` and deprecates the old name (removed in
   5.40). Families migrate one by one, so it is read from each model class's signature.
   Remove when the floor is >= 5.24 and every family takes ``cache``.
2. **``Cache.update``'s trailing arguments** (:data:`CACHE_UPDATE_EXTRAS`): up to 5.23 the
   layers call ``update(k, v, layer_idx, cache_kwargs)`` (a positional dict); 5.24 calls
   ``update(k, v, layer_idx, kwargs=kwargs)``. :class:`bass.cache.RaggedKVCache` accepts
   whatever the base ``Cache.update`` accepts (``*args, **kwargs``) and needs none of it.
3. **``Cache.get_mask_sizes``' argument**: ``cache_position`` (a tensor) up to 5.x,
   ``query_length`` (an int) later; bass's answer depends on neither, so it takes one
   positional argument of any kind.
"""

from __future__ import annotations

import inspect

import torch

__all__ = [
    "CACHE_UPDATE_EXTRAS",
    "cache_argument",
    "forward_cache_kwargs",
    "transformers_version",
]

#: Shim 2: what the layers may pass to ``Cache.update`` after ``layer_idx`` (ignored).
CACHE_UPDATE_EXTRAS = "positional cache_kwargs (<= 5.23) or keyword kwargs= (>= 5.24)"

# model class -> the name of its forward's cache argument (filled outside compiled code:
# hf.prepare runs before any pass, so a compiled forward only reads the dict)
_CACHE_ARG: dict[type, str] = {}


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def cache_argument(model: torch.nn.Module) -> str:
    """Shim 1: the keyword under which ``model``'s forward takes its cache: ``"cache"``
    (transformers >= 5.24, for the families that took the new name) or
    ``"past_key_values"``."""
    cls = type(model)
    name = _CACHE_ARG.get(cls)
    if name is None:
        params = inspect.signature(cls.forward).parameters
        name = "cache" if "cache" in params else "past_key_values"
        _CACHE_ARG[cls] = name
    return name


def forward_cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """``{cache_argument(model): cache}``: the keyword arguments that hand ``cache`` to
    ``model``'s forward without a deprecation warning on any supported version."""
    return {cache_argument(model): cache}

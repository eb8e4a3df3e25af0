"""bass: batched speculative decoding with ragged attention as PyTorch custom ops.

``import bass`` registers ``torch.ops.bass.ragged_attention`` and
``torch.ops.bass.kv_append`` (see :mod:`bass.ops`).
"""

from __future__ import annotations

from . import ops

__version__ = "0.1.0"

__all__ = ["__version__", "ops"]

"""Names ``engine.py`` and ``options.py`` import from here; this module goes when they
import :func:`bass.ops.resolve` and :func:`bass.ops.implementations` directly."""

from __future__ import annotations

import torch

from .plan import Implementation, implementations, resolve


def resolve_packed_implementation(
    impl: str, device: torch.device, planned: bool = True
) -> Implementation:
    """``resolve(impl, device)[0]``: an error saying why when it cannot run there."""
    return resolve(impl, device)[0]


packed_implementations = implementations  # see bass.ops.implementations

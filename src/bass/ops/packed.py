"""Names the engine and the option checks import from here (``engine.py`` and
``option_kinds.py``, owned by the engine's own work); they go when those modules import
:func:`bass.ops.resolve` and :func:`bass.ops.implementations` directly."""

from __future__ import annotations

import torch

from .plan import Implementation, implementations, resolve


def resolve_packed_implementation(
    impl: str, device: torch.device, planned: bool = True
) -> Implementation:
    """The implementation ``impl`` names on ``device`` (an error saying why when it cannot
    run there); see :func:`bass.ops.resolve`."""
    return resolve(impl, device)[0]


def packed_implementations(device: str | torch.device | None = None) -> list[str]:
    """See :func:`bass.ops.implementations`."""
    return implementations(device)

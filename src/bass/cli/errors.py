"""The error a ``bass`` subcommand raises for something the user can fix."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """Something the user can fix; printed as ``bass: error: ...`` (exit status 2)."""

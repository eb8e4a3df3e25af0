"""Fail a test when a dependency deprecates something that bass itself called.

transformers renames and deprecates the APIs bass hooks into every month; its deprecation
warnings are the early signal of the next break (5.24's ``past_key_values`` -> ``cache``
warned before it would have failed). pyproject's ``filterwarnings`` ignores third-party
noise by the module a warning is attributed to, which cannot tell "transformers calling
its own deprecated code" from "bass calling a deprecated transformers API": a warning's
``stacklevel`` often points into torch's module-call machinery instead of the caller.

So :func:`watch` looks at the whole stack of every deprecation a dependency raises
(``warnings.warn`` with ``DeprecationWarning``, ``PendingDeprecationWarning`` or
``FutureWarning``, and log records of the ``transformers`` logger that say "deprecat"):
walking outward from where it was raised, the first frame outside installed packages and
the standard library is the call site. When that frame is in ``src/bass``, bass made the
deprecated call and the test fails, naming the line. Calls the tests make themselves
(e.g. the reference ``generate``) are left to ``filterwarnings``.
"""

from __future__ import annotations

import contextlib
import logging
import site
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

import bass

BASS_DIR = str(Path(bass.__file__).resolve().parent)
_CATEGORIES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
_OUTSIDE = tuple(
    str(Path(p).resolve())
    for p in {
        *site.getsitepackages(),
        site.getusersitepackages(),
        *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
)


@dataclass
class Deprecation:
    message: str
    raised_at: str  # file:line inside the dependency
    call_site: str  # file:line inside bass


def _where(frame) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _third_party(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen ...>, <string>: interpreter machinery
        return True
    path = str(Path(filename).resolve())
    return not path.startswith(BASS_DIR) and path.startswith(_OUTSIDE)


def bass_call_site(frame) -> str | None:
    """``file:line`` of the bass frame that made the call raising at ``frame`` (the
    first frame outward that is not third-party), or ``None`` when that frame is not
    bass's (a test, a benchmark) or the warning was raised by bass itself."""
    if not _third_party(frame.f_code.co_filename):
        return None  # raised by bass or a test directly: not a dependency's deprecation
    while frame is not None and _third_party(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    if str(Path(frame.f_code.co_filename).resolve()).startswith(BASS_DIR):
        return _where(frame)
    return None


# the lists of the watches now open, innermost last: a deprecation goes to the innermost
# (a test that checks the guard itself keeps what it provokes from failing that test)
_OPEN: list[list[Deprecation]] = []


def _record(message: str, frame) -> None:
    site_ = bass_call_site(frame)
    if site_ is not None and _OPEN:
        _OPEN[-1].append(Deprecation(message, _where(frame), site_))


class _LogCatcher(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "deprecat" not in message.lower():
            return
        frame = sys._getframe(1)
        # skip the logging machinery up to the frame that logged the record
        while frame is not None and frame.f_code.co_filename != record.pathname:
            frame = frame.f_back
        if frame is not None:
            _record(message, frame)


_original_warn = warnings.warn
_handler = _LogCatcher()


def _warn(message, category=None, stacklevel=1, source=None, **kw):
    cat = category or (type(message) if isinstance(message, Warning) else UserWarning)
    if isinstance(cat, type) and issubclass(cat, _CATEGORIES):
        _record(str(message), sys._getframe(1))
    return _original_warn(message, category, stacklevel + 1, source, **kw)


@contextlib.contextmanager
def watch():
    """Collect, in the yielded list, every dependency deprecation whose call site is
    bass's, while the block runs (watches nest: the innermost one collects)."""
    seen: list[Deprecation] = []
    if not _OPEN:
        warnings.warn = _warn
        logging.getLogger("transformers").addHandler(_handler)
    _OPEN.append(seen)
    try:
        yield seen
    finally:
        _OPEN.pop()
        if not _OPEN:
            warnings.warn = _original_warn
            logging.getLogger("transformers").removeHandler(_handler)


def report(seen: list[Deprecation]) -> str:
    unique = {(d.message, d.raised_at, d.call_site): 0 for d in seen}
    for d in seen:
        unique[(d.message, d.raised_at, d.call_site)] += 1
    lines = [f"{len(seen)} deprecation(s) raised by a dependency about bass's own calls:"]
    for (message, raised_at, call_site), n in unique.items():
        times = f" (x{n})" if n > 1 else ""
        lines.append(f"  {message}{times}\n    raised at {raised_at}\n    bass call: {call_site}")
    lines.append("Fix the call in bass.compat (feature-detected), not the warning filter.")
    return "\n".join(lines)

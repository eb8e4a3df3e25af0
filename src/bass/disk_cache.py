"""Where bass keeps what it measured or converted once, across processes: one folder per
cache under ``~/.cache/bass`` (each moved by its own variable, which ``0`` turns off), and
writes that a reader never sees half done. A cache only saves time: an entry that cannot
be read is made again, and one that cannot be written is a log line, never an error."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

__all__ = ["OFF", "read_json", "root", "write_json"]

OFF = ("0", "off", "false", "no")  # a cache variable set to one of these: no cache
log = logging.getLogger(__name__)


def root(variable: str, name: str) -> Path | None:
    """The folder of cache ``name``: ``$variable`` where set, else ``~/.cache/bass/<name>``;
    ``None`` when ``$variable`` is ``0`` (or off, false, no)."""
    value = os.environ.get(variable, "").strip()
    if value.lower() in OFF:
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "bass" / name


def read_json(path: Path):
    """The JSON stored at ``path``, or ``None`` when there is none or it does not parse."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data, variable: str) -> None:
    """Store ``data`` at ``path`` whole or not at all: a temporary file beside it, renamed
    into place (processes writing at once: one wins, each wrote a whole file)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        log.warning("cannot write the cache entry %s (%s); set %s", path, e, variable)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)

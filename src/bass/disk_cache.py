"""Where bass keeps what it measured or converted once, across processes: one folder per
cache under ``~/.cache/bass`` (each moved by its own variable, which ``0`` turns off), and
writes that a reader never sees half done. A cache only saves time: an entry that cannot
be read is made again, and one that cannot be written is a log line, never an error."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["OFF", "read_json", "root", "store", "write_json"]

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
    """Store ``data`` as JSON at ``path``, whole or not at all (:func:`store`)."""
    text = json.dumps(data)  # outside store: data that is not JSON is the caller's error
    store(path, lambda tmp: tmp.write_text(text), variable)


def store(
    path: Path, fill: Callable[[Path], None], variable: str, whole: str | None = None
) -> None:
    """Write the file ``path`` whole or not at all: ``fill(tmp)`` writes a temporary one
    beside it, which is then renamed into place (processes writing at once: one wins, each
    wrote a whole file). ``whole``: ``path`` is a folder, whole once it holds the file
    ``whole`` (which ``fill`` writes last); its rename fails when another process's whole
    folder got there first, which is no error. A failure is a log line naming
    ``variable``, the cache's setting, never an error (caching only saves time)."""
    folder = whole is not None
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if folder:
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            os.close(fd)
            tmp = Path(name)
        fill(tmp)
        os.replace(tmp, path)
        tmp = None
    except Exception as e:  # caching never fails the work it saves
        if not (folder and (path / whole).is_file()):
            log.warning("cannot write the cache entry %s (%s); set %s", path, e, variable)
    finally:
        if tmp is not None and tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            tmp.unlink(missing_ok=True)

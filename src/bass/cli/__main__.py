"""``python -m bass.cli``: the same as ``python -m bass`` (see :mod:`bass.cli`)."""

import sys

from . import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

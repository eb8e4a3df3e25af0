"""``python -m bass``: the ``bass`` command (see :mod:`bass.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

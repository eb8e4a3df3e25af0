"""``python -m bass``: the ``bass`` command (see :mod:`bass.cli`)."""

import sys

if __name__ == "__main__":
    try:
        from .cli import main
    except KeyboardInterrupt:  # Ctrl-C while torch imports: no traceback
        sys.stderr.write("bass: interrupted\n")
        sys.exit(130)
    sys.exit(main())

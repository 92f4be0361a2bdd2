"""``python -m sluice``: the ``sluice`` command (``sluice/commands/``)."""

import sys

from sluice.commands import main

if __name__ == "__main__":
    sys.exit(main())

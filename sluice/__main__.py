"""``python -m sluice``: the ``sluice`` command (``sluice/commands/``)."""

import sys


def _main() -> int:
    # Before the command's imports (most of its start): `sluice proxy` takes
    # a SIGHUP that comes meanwhile as a reload once it serves, not its end.
    from sluice.proxy import hangup

    hangup.hold_for(sys.argv[1:])
    from sluice.commands import main

    return main()


if __name__ == "__main__":
    sys.exit(_main())

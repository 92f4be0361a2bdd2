"""Benchmarks (see bench/README.md). A package, so that the scripts and the
tests that check their arithmetic name each module one way (bench.peers)."""

import sys
from collections.abc import Callable


def run(main: Callable[[], int]) -> None:
    """Exit with ``main()``'s status; a broker that cannot start (a busy
    port, no Java, a cache it cannot write) is one line, not a traceback."""
    from sluice.brokers.embedded import BrokerError

    try:
        status = main()
    except BrokerError as exc:
        name = sys.argv[0].rsplit("/", 1)[-1].removesuffix(".py")
        print(f"{name}: {exc}", file=sys.stderr)
        status = 1
    sys.exit(status)

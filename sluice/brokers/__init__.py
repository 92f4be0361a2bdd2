"""Brokers Sluice starts for itself: ``sluice demo``, the tests and the benchmarks.

pulsar-lite (quick, no Java) lives in :mod:`sluice.brokers.embedded`; Apache Pulsar
itself in :mod:`sluice.brokers.apache_pulsar`. Both answer to :class:`Broker`.
"""

from __future__ import annotations

from typing import Protocol


class Broker(Protocol):
    """What callers use of a broker process we started, whichever it is."""

    host: str
    port: int

    @property
    def url(self) -> str: ...

    @property
    def address(self) -> tuple[str, int]: ...

    @property
    def pid(self) -> int | None: ...

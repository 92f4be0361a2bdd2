# Types of the compiled frame scanner (rust/src/lib.rs, built by maturin).

from collections.abc import Callable, Iterator, Sequence
from typing import Any

Scanned = tuple[int, int, int, int, int, int, int, int, int]

def scan(
    data: bytes, pos: int, max_total: int
) -> list[tuple[int, int, int, int, int, int, int, int, int]]:
    """One tuple per complete frame from ``pos``: (stop, kind, metadata_offset,
    payload_offset, checksum, a, b, c, properties); kind 0: decode in Python."""

def pack_frames(prefix: bytes, frames: list[Any], payloads: int) -> list[bytes | None]:
    """The recorder's frame records (payloads: 0 full, 1 hash, 2 size); None
    for each frame left to the Python recorder."""

class Batch:
    """The frames of a read the scanner took whole (``scan_batch``): a
    sequence of ``scan`` tuples, made when asked for."""

    @property
    def start(self) -> int: ...
    @property
    def stop(self) -> int: ...
    @property
    def counts(self) -> list[tuple[int, int, int]]:
        """[(type, frames, bytes), ...]"""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Scanned: ...
    def __iter__(self) -> Iterator[Scanned]: ...
    def pack(self, prefix: bytes, data: bytes, payloads: int) -> list[bytes | None]:
        """``pack_frames`` over these frames of ``data``."""

def cursus_batch_head(data: bytes, start: int = 0) -> tuple[int, int, int, int, int] | None:
    """(topic start, topic end, partition, count, last offset or -1) of
    ``data[start:]``, a Cursus batch body the reference decodes without an
    error (offsets in ``data``); else None."""

def scan_batch(data: bytes, pos: int, max_total: int) -> Batch | None:
    """Every complete frame from ``pos`` when the scanner took them all."""

def summary(
    raw: bytes,
) -> tuple[int, int, int, list[int] | None, tuple[int, int, int, str, int] | None] | None:
    """A recorded hot frame's summary numbers (rust/src/summary.rs); None:
    summarize it in Python."""

class SendTable:
    """SENDs in flight and a scanned read's accounting (rust/src/account.rs);
    ``sluice.protocols.pulsar.correlation.SendTable`` is the reference."""

    @property
    def in_flight(self) -> int: ...
    def __len__(self) -> int: ...
    def sending(
        self, producer_id: int, sequence_id: int, now: float, topic: str | None
    ) -> None: ...
    def sent(self, producer_id: int, sequence_id: int) -> tuple[float, str | None] | None: ...
    def peek(self, producer_id: int, sequence_id: int) -> tuple[float, str | None, int] | None: ...
    def waiting(self) -> list[tuple[int, int, float, str | None, int]]: ...
    def account_client(
        self, found: Batch | Sequence[Scanned], start: int, now: float, producers: dict[int, str]
    ) -> tuple[dict[str, list[int]] | None, list[int]]: ...
    def account_broker(
        self, found: Batch | Sequence[Scanned], start: int, now: float, consumers: dict[int, str]
    ) -> tuple[dict[str | None, list[float]] | None, dict[str, list[int]] | None]: ...

class Figures:
    """What compiled relay steps counted (rust/src/step.rs), taken by the
    metrics at scrape time."""

    def __init__(self, latency_bounds: list[float], relay_bounds: list[float]) -> None: ...
    def take(
        self,
    ) -> tuple[
        list[tuple[bool, int, int, int]],
        list[tuple[str, bool, int, int]],
        list[tuple[str, list[int], float]],
        list[tuple[bool, list[int], float]],
    ]:
        """(frames, topics, answered, relay) added since the last take."""
    def take_sealed(self) -> list[tuple[str, int]]:
        """(filter, messages) the compiled path encrypted since the last take."""
    def take_named(self) -> list[tuple[bool, str, int, int]]:
        """(from_client, name, frames, bytes) counted by name (Cursus) since
        the last take."""

class Seal:
    """One ``encrypt`` filter's data key as the compiled path uses it
    (rust/src/seal.rs)."""

    def __init__(self, name: str, fixed_iv: bytes | None = None) -> None: ...
    def arm(self, data_key: bytes, keys_field: bytes, until: float) -> None: ...
    @property
    def until(self) -> float: ...
    def seal(self, frame: bytes, now: float) -> bytes | None: ...

class Sealing:
    """One connection's producers whose SENDs the compiled step encrypts."""

    def __init__(self) -> None: ...
    def add(self, producer_id: int, seal: Seal) -> bool: ...
    def discard(self, producer_id: int) -> None: ...
    def __contains__(self, producer_id: int) -> bool: ...

class RecordSink:
    """Where compiled steps lay out their reads' frame records, in one buffer."""

    def __init__(
        self,
        max_frames: int,
        max_bytes: int,
        wake_frames: int,
        wake_bytes: int,
        wake: Callable[[], None],
    ) -> None: ...
    def take(self, queued: int, queued_bytes: int) -> tuple[bytes, int]: ...
    @property
    def frames(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def dropped(self) -> int: ...

STEP_HOLD_MAX: int  # the most of a frame's start a Step holds

class Step:
    """One proxied connection's compiled step: a relayed read carried whole."""

    def __init__(
        self,
        sends: SendTable,
        producers: dict[int, str],
        consumers: dict[int, str],
        figures: Figures,
        max_total: int,
        request: str,
        record: RecordSink | Callable[[list[bytes], int], None] | None = None,
        payloads: int = 1,
        conn: int = 0,
        monotonic_ns: int = 0,
        sealing: Sealing | None = None,
    ) -> None: ...
    def carry(
        self, source: int, sink: int, from_client: bool, now: float
    ) -> bytes | int | tuple[int, bytes, OSError | None, float] | None: ...
    @staticmethod
    def cursus(figures: Figures, max_body: int) -> Step:
        """A Cursus connection's step, for what its broker streams."""
    def take_held(self, from_client: bool) -> bytes: ...
    def give_held(self, from_client: bool, start: bytes) -> bool: ...
    def take_offset(self) -> int | None:
        """Where a Cursus stream goes on from, if carried reads moved it."""
    def expect_ok(self, request: str, sent: float, batched: bool = False) -> None:
        """The next read of a Cursus broker may be the OK answering the
        commit ``request`` (``OK batched=N`` if ``batched``): carried
        alone, timed as its answer."""
    def take_answered(self) -> int:
        """The requests carried reads answered since the last take; the
        expectation forgotten."""

class Lane:
    """One carried direction the relay thread's compiled loop may read
    itself while armed (rust/src/carrier.rs)."""

    def __init__(
        self,
        step: Step,
        source: int,
        sink: int,
        from_client: bool,
        slow: Callable[[], None],
        after: Callable[[object], None],
    ) -> None: ...
    def arm(self, epoch: int) -> None: ...
    def disarm(self) -> None: ...
    @property
    def step(self) -> Step:
        """The compiled step it carries reads with."""
    @property
    def runs(self) -> int: ...
    def __call__(self) -> None: ...

class Turn:
    """Which of the relay thread and trio's thread runs Python code (fair)."""

    def take(self) -> None: ...
    def give(self) -> None: ...

class Carrier:
    """The relay thread's compiled loop."""

    @property
    def epoch(self) -> int: ...
    @property
    def steps_run(self) -> int: ...
    @property
    def compiled_runs(self) -> int: ...
    def bump(self) -> None: ...
    @staticmethod
    def monotonic(offset: float) -> float: ...
    def run(
        self,
        epoll_fd: int,
        stop_fd: int,
        steps: dict[int, Callable[[], None]],
        turn: Turn,
        now: Callable[[], float],
        failed: Callable[[int, BaseException], None],
        offset: float | None = None,
    ) -> None: ...

def accept_now(fd: int) -> tuple[int, str, int] | None:
    """A connection waiting on a listening socket: its descriptor
    (non-blocking, close-on-exec) and its peer's host and port; None when
    none waits. Raises the OSError accept() would."""

def connect_now(host: str, port: int) -> tuple[int, bool] | None:
    """A TCP connection begun without waiting (non-blocking, TCP_NODELAY):
    its descriptor and whether it is connected already; None for a host
    that is not an IP address. Raises OSError where it fails at once."""

"""Cursus frames in recordings: the same records as Pulsar's, other summaries.

A Cursus recording is a recording like any other (docs/recording-format.md)
whose header says ``"protocol": "cursus"``. Its ``frame`` records hold the
frame as the client saw it (``[u32 length][body]``, rewritten addresses
included) in ``raw``, and a summary ``s``:

- ``cmd``: the command (``CREATE``, ``METADATA``, ``BATCH``, ``STREAM``, …)
  or reply (``OK``, ``ERROR``, ``ACK``, ``STREAM_CONTROL``, ``KEEPALIVE``);
- ``topic`` when the frame names one, ``msgs`` for a batch (its messages),
  ``part`` its partition;
- ``error``: an ``ERROR:`` reply's code, or an ack's status when not OK;
- ``invalid`` and ``why`` for a frame that failed validation;
- ``own``: ``true`` on a frame Sluice wrote to the client itself (a refusal
  of an invalid frame, a fault rule's answer, a drain's ``STREAM_CONTROL``),
  which no broker sent.

Payloads: with ``--record-payloads hash`` or ``none`` the ``raw`` of a frame
that carries the application's data is left out (empty) and the summary
keeps ``payload: {size, sha256}`` of its body (``{size}`` with ``none``):
batches, a plain envelope message, a command with ``message=`` (PUBLISH,
APPEND_STREAM, SAVE_SNAPSHOT), a command only the broker knows, a READ_SNAPSHOT
answer (``OK snapshot=``), a JSON reply with fields beyond an ack's (READ_STREAM
answers), and a frame that did not decode (what it holds cannot be told).
Everything else (commands, replies) is kept whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sluice.protocols.cursus.commands import Command, OtherCommand
from sluice.protocols.cursus.frame import EnvelopeMessage, Frame, OwnFrame
from sluice.protocols.cursus.replies import BatchAck, ErrorReply, OkReply
from sluice.recording.format import PayloadPolicy, Record, packer

PROTOCOL = "cursus"


def summarize(frame: Frame) -> dict[str, Any]:
    out: dict[str, Any] = {"cmd": frame.name}
    head = frame.head  # a batch's messages are not needed (nor decoded) here
    message: Any = frame.message if head is None else None
    if head is not None:
        out["topic"] = head.topic
        out["part"] = head.partition
        out["msgs"] = head.count
    else:
        topic = getattr(message, "topic", None) or frame.envelope
        if isinstance(topic, str) and topic and topic != "admin":
            out["topic"] = topic
    if isinstance(message, ErrorReply):
        out["error"] = message.code or "ERROR"
    elif isinstance(message, BatchAck) and message.status != "OK":
        out["error"] = message.status
    if frame.error is not None:
        out["invalid"] = frame.error.problem.value
        out["why"] = frame.error.message
    if isinstance(frame, OwnFrame):
        out["own"] = True
    return out


def carries_data(frame: Frame) -> bool:
    """Whether ``frame`` may hold the application's data (see above)."""
    if frame.head is not None:
        return True
    message = frame.message
    if message is None:
        return bool(frame.body)
    if isinstance(message, EnvelopeMessage):
        return True
    if isinstance(message, Command):
        if isinstance(message, OtherCommand) and not message.known:
            return True
        if getattr(message, "message", None) is not None:
            return True
        return any(key == "message" for key, _ in message.extra)
    if isinstance(message, OkReply):
        return any(word.startswith("snapshot=") for word in message.words)
    if isinstance(message, BatchAck):
        return bool(message.extra)
    return False


class CursusSummarizer:
    """Builds Cursus ``frame`` records (the Pulsar ``FrameSummarizer``'s twin)."""

    def __init__(self, payloads: PayloadPolicy = PayloadPolicy.HASH) -> None:
        self.payloads = PayloadPolicy(payloads)
        self._pack = packer()

    def forget(self, conn: int) -> None:
        """Nothing kept per connection."""

    def record(self, conn: int, direction: int, mono_ns: int, wall_ns: int, frame: Frame) -> Record:
        summary = summarize(frame)
        raw = frame.raw
        if self.payloads is not PayloadPolicy.FULL and carries_data(frame):
            info: dict[str, Any] = {"size": len(frame.body)}
            if self.payloads is PayloadPolicy.HASH:
                info["sha256"] = hashlib.sha256(frame.body).hexdigest()
            summary["payload"] = info
            raw = b""
        return {"k": "frame", "c": conn, "d": direction, "t": mono_ns, "w": wall_ns,
                "n": len(frame.raw), "raw": raw, "s": summary}  # fmt: skip

    def packed(
        self, conn: int, direction: int, mono_ns: int, wall_ns: int, frames: Sequence[Frame]
    ) -> list[bytes]:
        return [self._pack(self.record(conn, direction, mono_ns, wall_ns, f)) for f in frames]

"""Hypothesis strategies for Cursus values: commands, replies, batches.

Everything drawn here encodes to bytes that decode back to an equal value;
words keep to characters that read back the same way the broker reads them.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any

from hypothesis import strategies as st

from sluice.protocols.cursus import (
    Batch,
    BatchAck,
    BatchCommit,
    Command,
    ErrorReply,
    Message,
    OkReply,
    OtherCommand,
    StreamControl,
)
from sluice.protocols.cursus.commands import OTHER, TYPED

_WORD_CHARS = string.ascii_letters + string.digits + "_-.:/,"
# Command values are split on whitespace only: quotes and brackets are plain.
_VALUE_CHARS = _WORD_CHARS + '"[]{}'
words = st.text(alphabet=_WORD_CHARS, min_size=1, max_size=8)
values = st.text(alphabet=_VALUE_CHARS, max_size=8)
keys = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=6)
ints = st.integers(min_value=-(2**40), max_value=2**40)
# Bare words of a command: no "=" (it would make them key=value), lower case
# (so that none reads as BATCH_COMMIT's P<n>:<offset> list).
bare = st.text(alphabet=string.ascii_lowercase + string.digits + "_-.", min_size=1, max_size=6)


def _extra(taken: set[str]) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    free = keys.filter(lambda k: k not in taken and k != "message")
    return st.lists(st.tuples(free, values), max_size=3).map(tuple)


def _field_strategy(type_: str) -> st.SearchStrategy[Any]:
    base: st.SearchStrategy[Any]
    if type_.startswith("int"):
        base = ints
    elif type_.startswith("bool"):
        base = st.booleans()
    else:
        base = values
    return st.none() | base if "None" in type_ else base


def _typed(cls: type[Command]) -> st.SearchStrategy[Command]:
    fields: dict[str, st.SearchStrategy[Any]] = {}
    taken: set[str] = set()
    for f in dataclasses.fields(cls):
        if f.name in ("extra", "args"):
            continue
        taken.add(f.name)
        if f.name == "offsets":
            fields[f.name] = st.lists(
                st.tuples(st.integers(0, 1000), st.integers(0, 2**40)), min_size=1, max_size=4
            ).map(tuple)
        elif f.name == "message":
            fields[f.name] = st.none() | st.text(max_size=20)
        else:
            fields[f.name] = _field_strategy(str(f.type))
    fields["extra"] = _extra(taken)
    fields["args"] = st.lists(bare, max_size=2).map(tuple)
    return st.builds(cls, **fields)


def _other() -> st.SearchStrategy[Command]:
    return st.builds(
        OtherCommand,
        command=st.sampled_from(sorted(OTHER)),
        extra=_extra(set()),
        args=st.lists(bare, max_size=2).map(tuple),
    )


def commands() -> st.SearchStrategy[Command]:
    """Any command the broker knows, typed fields at random."""
    return st.one_of(*(_typed(cls) for cls in TYPED.values()), _other())


def batch_commits() -> st.SearchStrategy[Command]:
    return _typed(BatchCommit)


def _text(max_size: int = 12) -> st.SearchStrategy[str]:
    return st.text(max_size=max_size)


def messages() -> st.SearchStrategy[Message]:
    u64 = st.integers(0, 2**64 - 1)
    return st.builds(
        Message,
        offset=u64,
        seq_num=u64,
        producer_id=_text(),
        key=_text(),
        epoch=st.integers(-(2**63), 2**63 - 1),
        payload=st.binary(max_size=40),
        event_type=_text(6),
        schema_version=st.integers(0, 2**32 - 1),
        aggregate_version=u64,
        metadata=_text(),
    )


def batches() -> st.SearchStrategy[Batch]:
    return st.builds(
        Batch,
        topic=st.text(min_size=1, max_size=12),
        partition=st.integers(-(2**31), 2**31 - 1),
        acks=st.sampled_from(["0", "1", "-1", ""]) | st.text(max_size=4),
        idempotent=st.booleans(),
        seq_start=st.integers(0, 2**64 - 1),
        seq_end=st.integers(0, 2**64 - 1),
        messages=st.lists(messages(), max_size=4).map(tuple),
    )


_reply_word = st.one_of(
    words,
    st.builds(lambda k, v: f"{k}={v}", keys, st.text(alphabet=_WORD_CHARS, max_size=8)),
    st.builds(lambda k, v: f'{k}="{v}"', keys, st.text(alphabet=_WORD_CHARS + " =", max_size=10)),
    st.builds(lambda k, v: f"{k}=[{v}]", keys, st.text(alphabet=string.digits + " ,", max_size=8)),
)


def replies() -> st.SearchStrategy[Any]:
    """Any text or JSON reply."""
    reply_words = st.lists(_reply_word, max_size=5).map(tuple)
    ok = st.builds(OkReply, reply_words)
    error = st.builds(ErrorReply, words.filter(lambda w: "=" not in w), reply_words)
    optional = st.none() | ints
    control = st.builds(
        StreamControl,
        type=words.filter(lambda w: "=" not in w),
        reason=st.just("") | words,
        offset=optional,
        requested=optional,
        earliest=optional,
        latest=optional,
        extra=st.lists(
            st.tuples(
                keys.filter(
                    lambda k: (
                        k not in {"type", "reason", "offset", "requested", "earliest", "latest"}
                    )
                ),
                st.text(alphabet=_WORD_CHARS, max_size=6),
            ),
            max_size=2,
        ).map(tuple),
    )
    ack = st.builds(
        BatchAck,
        status=st.sampled_from(["OK", "PARTIAL", "ERROR"]),
        last_offset=ints,
        producer_epoch=ints,
        producer_id=_text(),
        seq_start=ints,
        seq_end=ints,
        leader=st.none() | _text(),
        error=st.none() | _text(),
    )
    return st.one_of(ok, error, control, ack)

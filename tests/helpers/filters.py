"""Filters the tests configure by ``module:attr`` (tests.helpers.filters:NAME)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sluice.filters import PASS, Filter, Message, NoSettings, Reject, Replace, Verdict


@dataclass(frozen=True)
class WordSettings:
    word: str = "bad"
    error: str | None = None


class Words(Filter[WordSettings]):
    """Refuses produced messages holding ``word``; upper-cases ones holding
    "shout"; adds a property to every delivery and skips deliveries holding "skip"."""

    Settings = WordSettings

    def on_produce(self, message: Message) -> Verdict:
        settings = self.settings
        if settings.word.encode() in message.payload:
            return Reject(
                "word", f"message {message.index} holds {settings.word!r}", settings.error
            )
        if b"shout" in message.payload:
            return Replace(
                payload=message.payload.upper(), properties={**message.properties, "loud": "1"}
            )
        return PASS

    def on_deliver(self, message: Message) -> Verdict:
        if b"skip" in message.payload:
            return Reject("skipped")
        return Replace(properties={**message.properties, "seen-by": "sluice"})


class Raises(Filter[NoSettings]):
    """Raises on every produced message."""

    def on_produce(self, message: Message) -> Verdict:
        raise RuntimeError("filter bug")


class Suffix(Filter[NoSettings]):
    """Appends "+" to produced payloads (to see the order filters run in)."""

    def on_produce(self, message: Message) -> Verdict:
        return Replace(payload=message.payload + b"+")


class Grow(Filter[NoSettings]):
    """Makes every produced payload 6 MiB that do not compress: past
    Pulsar's default frame limit."""

    def on_produce(self, message: Message) -> Verdict:
        return Replace(payload=random.Random(0).randbytes(6 * 1024 * 1024))


class Forgets(Filter[NoSettings]):
    """Forgets to return PASS (returns None), as hooks new to the API do."""

    def on_produce(self, message: Message) -> Verdict:
        return None  # type: ignore[return-value]

"""The filter API: what a filter is, what it sees, what it answers.

A filter is a class with two hooks, one per direction, each called with one
``Message`` (a single, uncompressed application message, even when the
client batched or compressed it) and answering ``PASS``, ``Replace(...)``
or ``Reject(...)``. Hooks are plain functions of their input: no sockets,
no waiting, no threads (sans-I/O, like Sluice's protocol cores), so a filter
is tested by calling it. Settings are a dataclass the filter names as
``Settings``; Sluice builds it from the configuration and checks it at
start. See docs/filters.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from sluice.protocols.filtering import PASS, Direction, Message, Sealer, Verdict


@dataclass(frozen=True)
class NoSettings:
    """The settings of a filter that takes none."""


S = TypeVar("S")


class Filter(Generic[S]):
    """Subclass this and override the hooks you need (both pass by default).

    ``class Mask(Filter[MaskSettings])`` types ``self.settings``.

    ``Settings`` is a dataclass of the filter's own settings (the
    ``settings`` table of its configuration); its fields' types are checked
    at start: ``str``, ``int``, ``float``, ``bool``, lists of them
    (``list[str]``, ``tuple[str, ...]``, ``Sequence[str]``, ``set[str]``),
    tables (``dict[str, str]``, ``Mapping[str, int]``), a ``Literal`` of
    choices, and any of these ``| None``.
    ``wants_schema``: Sluice gives each produced message the topic's schema
    (``message.schema``), asking the broker for it when it has not yet
    (deliveries get None).
    """

    Settings: ClassVar[type[Any]] = NoSettings
    wants_schema: ClassVar[bool] = False

    def __init__(self, settings: S) -> None:
        self.settings: S = settings

    def on_produce(self, message: Message) -> Verdict:
        """A message a producer sent, before it reaches the broker."""
        return PASS

    def on_deliver(self, message: Message) -> Verdict:
        """A message the broker delivers, before it reaches the consumer."""
        return PASS

    def sealer(self, direction: Direction) -> Sealer | None:
        """For a filter that encrypts whole entries end to end (the built-in
        ``encrypt``): what encrypts produced entries (``produce``) or
        decrypts delivered ones (``deliver``); None: it does not."""
        return None

"""Filters: code that acts on the messages Sluice relays.

Write a filter by subclassing ``Filter`` (``sluice.filters.api``); Sluice
finds it by entry point group ``sluice.filters`` or as ``module:attr``, runs
it for the topics, directions and roles its configuration names
(``sluice.filters.config``) and carries out what it answers
(``sluice.filters.chain``). Built in: schema validation
(``sluice.filters.schema``) and encryption in Pulsar's end-to-end format
(``sluice.filters.encryption``). See docs/filters.md.
"""

from sluice.filters.api import Filter, NoSettings
from sluice.protocols.filtering import (
    DELIVER,
    PASS,
    PRODUCE,
    Direction,
    Message,
    Pass,
    Reject,
    Replace,
    Schema,
    Verdict,
)

__all__ = [
    "DELIVER",
    "PASS",
    "PRODUCE",
    "Direction",
    "Filter",
    "Message",
    "NoSettings",
    "Pass",
    "Reject",
    "Replace",
    "Schema",
    "Verdict",
]

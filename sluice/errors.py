"""Errors every layer shares, and reporting errors that trio wraps in groups."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is invalid. The message is one line meant for the user."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]

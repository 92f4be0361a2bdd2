"""Tokens of Cursus text lines, with their positions.

Commands and replies are words separated by whitespace; most words are
``key=value``. Three value forms need more than a split: a quoted value
(``reason="invalid topic length"``), a bracketed list that may hold spaces
(``assignments=[0 1]``) and, in commands, ``message=`` whose value is the
rest of the line. Positions are kept so that a rewrite can replace one value
and leave every other byte as it was.

Text is decoded with ``surrogateescape`` so that any bytes survive a decode
and re-encode unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.protocols.cursus.errors import LocalProtocolError, Problem

ENCODING = "utf-8"
ERRORS = "surrogateescape"
# Keys whose value runs to the end of the line (commands only).
REST_OF_LINE = frozenset({"message"})


# What the broker's integers hold: int64, or uint64 for offsets and sequences.
INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
_INT = re.compile(r"-?[0-9]{1,20}")


def to_int(value: str) -> int | None:
    """``value`` as an integer, or ``None`` when it is no decimal integer a
    64-bit field holds (more digits than that would make ``int()`` raise,
    past Python's limit on digits, rather than refuse)."""
    if not _INT.fullmatch(value):
        return None
    number = int(value)
    return number if INT_MIN <= number <= INT_MAX else None


def decode_text(body: bytes) -> str:
    return body.decode(ENCODING, ERRORS)


def encode_text(text: str) -> bytes:
    try:
        return text.encode(ENCODING, ERRORS)
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(Problem.PARSE, f"text cannot be encoded: {exc}") from None


@dataclass(frozen=True, slots=True)
class Token:
    """One word: ``text[start:end]``; for ``key=value`` words, the key and
    where the value sits (``value_start``)."""

    start: int
    end: int
    key: str | None
    value_start: int

    def raw(self, text: str) -> str:
        return text[self.start : self.end]

    def value(self, text: str) -> str:
        return text[self.value_start : self.end]


def tokens(
    text: str, *, rest_of_line: frozenset[str] = frozenset(), quoted: bool = False
) -> list[Token]:
    """Split ``text`` into words the way the broker and the client read it.

    ``quoted``: read ``key="…"`` and ``key=[…]`` values as one word (replies).
    ``rest_of_line``: keys whose value is everything after the ``=`` (commands).
    """
    if quoted and ('"' in text or "[" in text):
        return _tokens_by_char(text, rest_of_line, quoted)
    # Nearly every line: words are runs of non-space, found by the regex
    # engine (a character at a time in Python, this was a fifth of what the
    # proxy's core spent on a consumer's commit). The same split as below,
    # which tests hold it to: \s and str.isspace() are one Unicode set.
    out: list[Token] = []
    for word in _WORD.finditer(text):
        start, end = word.span()
        equals = text.find("=", start + 1, end)
        if equals < 0:
            out.append(Token(start, end, None, start))
            continue
        key = text[start:equals]
        if key in rest_of_line:
            out.append(Token(start, len(text), key, equals + 1))
            return out
        out.append(Token(start, end, key, equals + 1))
    return out


_WORD = re.compile(r"\S+")


def _tokens_by_char(text: str, rest_of_line: frozenset[str], quoted: bool) -> list[Token]:
    """``tokens``, a character at a time: quoted and bracketed values
    may hold spaces."""
    out: list[Token] = []
    n = len(text)
    i = 0
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return out
        start = i
        key: str | None = None
        value_start = start
        while i < n and not text[i].isspace():
            ch = text[i]
            if ch == "=" and key is None:
                if i > start:
                    key = text[start:i]
                    value_start = i + 1
                    if key in rest_of_line:
                        out.append(Token(start, n, key, value_start))
                        return out
                i += 1
                if not quoted:
                    continue
                if i < n and text[i] == '"':
                    i = _after_quoted(text, i)
                elif i < n and text[i] == "[":
                    close = text.find("]", i)
                    i = n if close < 0 else close + 1
                continue
            i += 1
        out.append(Token(start, i, key, value_start))


def _after_quoted(text: str, i: int) -> int:
    """Index just past the closing quote of the quoted string at ``i`` (or the end)."""
    n = len(text)
    i += 1
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i + 1
        i += 1
    return n


def unquote(value: str) -> str:
    """The text inside a quoted value (backslash escapes undone); other values as they are."""
    if len(value) < 2 or value[0] != '"' or value[-1] != '"':
        return value
    out: list[str] = []
    i = 1
    end = len(value) - 1
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
    while i < end:
        ch = value[i]
        if ch == "\\" and i + 1 < end:
            nxt = value[i + 1]
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
            if nxt == "x" and i + 3 < end + 1:
                try:
                    out.append(chr(int(value[i + 2 : i + 4], 16)))
                    i += 4
                    continue
                except ValueError:
                    pass
        out.append(ch)
        i += 1
    return "".join(out)


def is_word(value: str) -> bool:
    """Whether ``value`` can stand as one bare word (no whitespace, not empty)."""
    return bool(value) and not any(ch.isspace() for ch in value)

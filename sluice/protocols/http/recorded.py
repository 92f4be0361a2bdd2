"""What a recording keeps of an HTTP exchange: credentials out, sans-I/O.

``sluice/proxy/http_recording.py`` records each exchange of the HTTP
listener and each frame of a WebSocket session (``http`` and ``ws``
records, docs/recording-format.md); what may be written of a request's
target, headers and bodies is decided here, on values:

- ``redact_target``: a request target (or a URL) with the values of
  credential-like query parameters (``token=``, ``jwt=``, ``api_key=`` …)
  and path parameters (a servlet session's ``;jsessionid=``) replaced by
  ``<redacted>``, and a credential set as a broker's dynamic config in the
  path.
- ``redact_headers``: headers as text pairs, the values of those that
  carry credentials (``Authorization``, ``Proxy-Authorization``,
  ``Cookie``, ``Set-Cookie``, ``X-Original-Principal``, anything named like
  a token, key, secret or password) replaced, and URLs in ``Location``
  and ``Referer`` redacted as targets.
- ``redact_body``: a JSON, form (whatever its declared type: an OAuth2
  token request's form sent as ``text/plain``) or ``multipart/form-data`` body (kept
  whole with ``--record-payloads full``) with the values of credential-like
  keys replaced (each part of a multipart body as its own content type
  says, found by its boundary; a package's binary part kept unparsed);
  any other body as it came; None for one that cannot be checked
  (one that starts like JSON but does not parse whole, JSON nested too
  deep, a credential's key given twice in an object, a multipart body that
  does not parse): a recording keeps its
  digest instead.
- ``decoded``: a body with a ``Content-Encoding`` (gzip, deflate: Pulsar's
  web service gzips its answers for clients that accept it) as it is to be
  checked for credentials; None where it cannot be.

Nothing here imports trio.
"""

from __future__ import annotations

import contextlib
import email.errors
import email.header
import email.message
import email.utils
import json
import re
import urllib.parse
import zlib
from collections.abc import Iterable
from typing import Any

from sluice.protocols.credentials import names_a_credential

MARKER = "<redacted>"
# A header whose value is a credential (or names who holds one).
_SENSITIVE_HEADER = re.compile(
    r"auth|token|passw|secret|credential|key|cookie|session|jwt|signature|principal",
    re.IGNORECASE,
)
# ``pulsar-admin brokers update-dynamic-config`` puts the value in the path:
# ``/admin/v2/brokers/configuration/{name}/{value}``.
_DYNAMIC_CONFIG = re.compile(r"(/admin(?:/v2)?/brokers/configuration/)([^/]+)/(.+)", re.IGNORECASE)
# Headers whose value is a URL: its query is redacted like a target's.
_URL_HEADERS = frozenset({"location", "content-location", "referer", "origin"})


def sensitive_header(name: str) -> bool:
    """A header whose value is not recorded (a WebSocket handshake's key
    and accept values are nonces, not credentials; its subprotocols may
    be one, as browsers, which cannot set ``Authorization`` on a WebSocket,
    send a token there). Any name ``names_a_credential`` knows is one too,
    whatever its prefix."""
    lower = name.lower()
    if lower == "sec-websocket-protocol" or names_a_credential(lower):
        return True
    return not lower.startswith("sec-websocket-") and bool(_SENSITIVE_HEADER.search(lower))


def _redact_query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, eq, _ = part.partition("=")
        if eq and names_a_credential(urllib.parse.unquote_plus(name)):
            part = f"{name}={MARKER}"
        parts.append(part)
    return "&".join(parts)


def _canonical(path: str) -> str:
    """A path as a web server routes it: percent-escapes decoded, dot
    segments (``.``, ``..``) removed."""
    out: list[str] = []
    for segment in urllib.parse.unquote(path).split("/"):
        if segment == "..":
            if len(out) > 1:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return "/".join(out)


def _redact_params(path: str) -> str:
    """A path with the values of credential-like path parameters (a
    servlet container's ``;jsessionid=…``, matrix parameters of any
    segment) replaced, the rest of it as it came."""
    if ";" not in path:
        return path
    segments = []
    for segment in path.split("/"):
        head, *params = segment.split(";")
        for i, param in enumerate(params):
            name, eq, _ = param.partition("=")
            if eq and names_a_credential(urllib.parse.unquote(name)):
                params[i] = f"{name}={MARKER}"
        segments.append(";".join([head, *params]))
    return "/".join(segments)


def redact_target(target: bytes | str) -> str:
    """A request target or URL as text, credential-like query values and
    path parameters (``;jsessionid=…``) replaced (the rest of it as it
    came); user information in an absolute
    or scheme-relative URL is replaced too, and the value a broker's
    dynamic config is set to in the path
    (``/admin/v2/brokers/configuration/{name}/{value}``) where the name is
    a credential's."""
    text = target.decode("latin-1") if isinstance(target, bytes) else target
    text, hash_, fragment = text.partition("#")
    base, q, query = text.partition("?")
    # An absolute URL, or a scheme-relative one (``//user:pass@host/…``).
    opening = "//" if base.startswith("//") else "://" if "://" in base else ""
    if opening:
        scheme, _, rest = base.partition(opening)
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            authority = f"{MARKER}@{authority.rpartition('@')[2]}"
        path = _redact_params(path)
        base = f"{scheme}{opening}{authority}{slash}{path}"
    else:
        base = _redact_params(base)
    config = _DYNAMIC_CONFIG.search(base)
    if config is not None and names_a_credential(urllib.parse.unquote(config.group(2))):
        base = f"{base[: config.start(3)]}{MARKER}"
    else:
        # The broker routes the path decoded, its dot segments removed: a
        # path spelled otherwise (``configur%61tion``, ``/./``) sets the
        # same config. Such a path is recorded as the broker reads it.
        whole_path = slash + path if opening else base
        head = base[: len(base) - len(whole_path)]
        canonical = _canonical(whole_path)
        config = _DYNAMIC_CONFIG.search(canonical)
        if config is not None and names_a_credential(config.group(2)):
            base = f"{head}{canonical[: config.start(3)]}{MARKER}"
    if q:
        base += "?" + _redact_query(query)
    return base + (hash_ + _redact_query(fragment) if hash_ else "")


def redact_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[list[str]]:
    """Headers as ``[name, value]`` text pairs, credentials replaced."""
    out = []
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1")
        lower = name.lower()
        if sensitive_header(lower):
            value = MARKER
        elif lower in _URL_HEADERS:
            value = redact_target(value)
        out.append([name, value])
    return out


# JSON nested deeper than this is not looked into (nor kept: its digest is).
MAX_DEPTH = 100


class _TooDeep(Exception):
    pass


class _Duplicate(Exception):
    """A JSON object gives a key twice where which one a reader takes matters."""


def _scrub(value: Any, depth: int = 0) -> tuple[Any, bool]:
    """A JSON value with credential-like keys' values replaced; whether any
    were. ``_TooDeep`` past ``MAX_DEPTH`` levels."""
    if depth > MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and names_a_credential(key) and item not in (None, "", MARKER):
                out[key], changed = MARKER, True
            else:
                out[key], inner = _scrub(item, depth + 1)
                changed = changed or inner
        return out, changed
    if isinstance(value, list):
        items = [_scrub(item, depth + 1) for item in value]
        return [i for i, _ in items], any(c for _, c in items)
    return value, False


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object from its members, ``_Duplicate`` where a key given twice
    names a credential or the value dropped for a later one holds one: a
    reader that takes the first of duplicate keys (or all of them) takes
    what ``json.loads``, which keeps the last, would not redact."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and (names_a_credential(key) or _scrub(out[key])[1]):
            raise _Duplicate
        out[key] = value
    return out


def redact_body(body: bytes, content_type: str = "") -> tuple[bytes | None, bool]:
    """A body to keep whole, and whether credentials were replaced in it: a
    JSON document's credential-like keys, a form's credential-like fields
    (a body that is a form whatever its declared type: ``text/plain``, no
    type), each part of a ``multipart/form-data`` body as its own type says (and
    the whole value of a part named like a credential; a binary part is
    not looked into). Another body is
    kept as it came. None: a body that cannot be checked for credentials
    (one that starts like JSON but does not parse whole, JSON nested too
    deep, a JSON object with a credential's key twice, a multipart body that
    does not parse), not to be kept (its digest is)."""
    if content_type.lower().lstrip().startswith("multipart/"):
        return _redact_multipart(body, content_type)
    if _like_json(body, 0, len(body)):
        try:
            document = json.loads(body, object_pairs_hook=_object)
            scrubbed, changed = _scrub(document)
        except (RecursionError, _TooDeep, _Duplicate, ValueError, UnicodeDecodeError):
            # Starts like JSON but is no JSON document: a lenient reader
            # (the broker's Jackson reads the first value and ignores what
            # follows, and may allow comments) takes credentials from it
            # that this one cannot find. Not kept.
            return None, False
        if not changed:
            return body, False
        return json.dumps(scrubbed, separators=(",", ":")).encode(), True
    if "x-www-form-urlencoded" in content_type.lower():
        # Byte for byte (a byte order mark or raw UTF-8 before a
        # credential's name does not keep it from being looked at).
        text = body.decode("latin-1")
        redacted = _redact_query(text)
        return redacted.encode("latin-1"), redacted != text
    form = _as_form(body)
    if form is not None:
        # A form sent as text/plain, with no type or any other: what a
        # reader of forms takes from it is as secret. Its line break kept.
        text, line_break = form
        redacted = _redact_query(text)
        return redacted.encode("ascii") + line_break, redacted != text
    return body, False


# A body that is a form whatever its type says (``text/plain``, none):
# fields joined by ``&``, each a name as a form's writer spells it
# (letters, digits, ``_.~*-[]``, percent-escapes), ``=`` and a value of
# visible ASCII (or no ``=``, or an empty field, as lenient readers take
# them), at most a line break at its end. Text (spaces, lines), JSON and
# bytes are none: they are kept as they came.
_VISIBLE = bytes(range(0x21, 0x7F))
# A field that is none (found where one begins): an empty name before its
# ``=``, or a name spelled otherwise.
_NOT_A_FIELD = re.compile(rb"(?:\A|&)(?:=|(?![A-Za-z0-9_.~*%\[\]-]*+(?:[=&]|\Z)))")


def _as_form(body: bytes) -> tuple[str, bytes] | None:
    """A body that is a form with a value (see above): its fields as text,
    and the line break after them; None for any other."""
    if b"=" not in body:
        return None  # no value: nothing to redact
    cut = len(body) - (2 if body.endswith(b"\r\n") else 1 if body.endswith(b"\n") else 0)
    fields = body[:cut]
    if fields.translate(None, _VISIBLE) or _NOT_A_FIELD.search(fields):
        return None  # a blank, a control, a byte past ASCII; a field that is none
    return fields.decode("ascii"), body[cut:]


# A multipart part whose bytes are not looked into for credentials, by its
# type: a well-formed one other than text, JSON or a form (a function's
# jar, a connector's nar, a package), unless its bytes start like JSON. A
# part without a type is ``text/plain``.
_BINARY_TYPE = re.compile(r"(?!text/)[\w!#$&^.+-]+/[\w!#$&^.+-]+")
_TEXT_LIKE = re.compile(r"json|x-www-form-urlencoded")
# A parameter of a part's Content-Disposition that gives its name
# (``name="…"`` or ``name=…``); ``name*=`` (RFC 2231) is left to the stdlib.
_NAME_PARAM = re.compile(r';\s*name\s*=\s*(?:"((?:[^"\\]|\\.)*)(?:"|$)|([^;\s]*))', re.IGNORECASE)
_EXTENDED_NAME = re.compile(r";\s*name\*", re.IGNORECASE)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header's name
_NOT_BLANK = re.compile(rb"[^ \t\r\n]")
_LINE_END = re.compile(rb"[ \t]*(\r?\n|\Z)")


def _param_names(disposition: str) -> list[str]:
    """The names a part's Content-Disposition gives it (more than one where
    it is odd: all are checked)."""
    names = [
        re.sub(r"\\(.)", r"\1", quoted) if quoted or not bare else bare
        for quoted, bare in _NAME_PARAM.findall(disposition)
    ]
    for name in list(names):  # RFC 2047 encoded words (=?UTF-8?B?...?=), decoded too
        if "=?" in name:
            with contextlib.suppress(ValueError, LookupError, email.errors.HeaderParseError):
                names.append(str(email.header.make_header(email.header.decode_header(name))))
    extended = _EXTENDED_NAME.search(disposition)
    if extended:  # RFC 2231: charset, percent-escapes, continuations
        names.append(disposition[extended.end() :].replace("%", ""))  # where escapes are odd
        message = email.message.Message()
        message["content-disposition"] = disposition
        value = message.get_param("name", header="content-disposition")
        if value is not None and not isinstance(value, str):
            value = email.utils.collapse_rfc2231_value(value)
        if isinstance(value, str):
            names.append(value)
    return names


def _like_json(body: bytes, start: int, end: int) -> bool:
    """Whether ``body[start:end]`` starts like a JSON document or array, in
    any encoding a JSON reader tells from its first bytes: UTF-8 with or
    without a byte order mark (RFC 8259 lets a reader ignore one, and the
    broker's Jackson does), UTF-16 or UTF-32 (which Jackson reads too, as
    ``json.loads`` does)."""
    encoding = json.detect_encoding(body[start : min(start + 4, end)])
    if encoding in ("utf-8", "utf-8-sig"):
        skip = 3 if encoding == "utf-8-sig" else 0
        first = _NOT_BLANK.search(body, start + skip, end)
        return first is not None and first.group() in (b"{", b"[")
    text = body[start:end].decode(encoding, "replace")
    return text.lstrip("\ufeff \t\r\n")[:1] in ("{", "[")


def _delimiter(body: bytes, marker: bytes, at: int) -> tuple[int, int, bool] | None:
    """The next delimiter line of a multipart body from ``at``: where it
    begins (with the line break before it, which belongs to it), where the
    line after it begins, and whether it is the close delimiter. None if
    there is none, or the boundary is next found where no delimiter can be
    (inside a line, or followed by more than blanks): RFC 2046 allows it
    nowhere else, and where a reader would split the body is unsure."""
    found = body.find(marker, at)
    if found < 0 or (found > 0 and body[found - 1] != 0x0A):
        return None
    end = found + len(marker)
    closing = body.startswith(b"--", end)
    rest = _LINE_END.match(body, end + 2 if closing else end)
    if rest is None or not (closing or rest.group(1)):
        return None
    begins = max(found - 1, 0)
    if begins > at and body[begins - 1] == 0x0D:
        begins -= 1
    return begins, rest.end(), closing


def _part_headers(body: bytes, at: int, end: int) -> tuple[dict[str, str], int] | None:
    """A part's headers (by lower-case name, the first of each) and where
    its payload begins; None where they do not end with a blank line or a
    line is no header."""
    if body.startswith(b"\r\n", at, end):
        return {}, at + 2
    if body.startswith(b"\n", at, end):
        return {}, at + 1
    blank = body.find(b"\n\r\n", at, end)
    bare = body.find(b"\n\n", at, blank if blank >= 0 else end)
    if bare >= 0:
        block, payload = bare + 1, bare + 2
    elif blank >= 0:
        block, payload = blank + 1, blank + 3
    else:
        return None
    headers: dict[str, str] = {}
    last = ""
    for line in body[at:block].decode("latin-1").splitlines():
        if line[:1] in (" ", "\t") and last:  # folded onto the line before
            headers[last] += " " + line.strip()
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            return None
        last = name.lower()
        headers.setdefault(last, value.strip())
    return headers, payload


def _redact_multipart(body: bytes, content_type: str) -> tuple[bytes | None, bool]:
    """A multipart body (``pulsar-admin`` sends functions', sources' and
    sinks' configs as ``multipart/form-data``), its parts found by their
    boundary: a part named like a credential replaced whole; one that may
    hold credentials (JSON, a form, text, or bytes that start like JSON)
    redacted as its own content type says; any other (a package's bytes)
    kept as it came, not looked into. Each written back in its place, the
    rest of the body as it came. None where the body is not multipart
    with that boundary up to its close delimiter (the boundary anywhere
    else, a part's headers without their blank line), or a part that may
    hold credentials cannot be checked (a transfer encoding, a nested
    multipart)."""
    header = email.message.Message()
    header["content-type"] = content_type
    boundary = header.get_boundary()
    if not boundary:
        return None, False
    marker = b"--" + boundary.encode("latin-1", "replace")
    found = _delimiter(body, marker, 0)
    if found is None:
        return None, False
    out: list[bytes] = []
    kept = 0  # how much of the body is in ``out`` already
    changed = False
    _, at, closing = found
    if closing:  # no part at all: not what a client sends (the rest may be anything)
        return None, False
    while not closing:
        found = _delimiter(body, marker, at)
        if found is None:  # no close delimiter
            return None, False
        end, after, closing = found
        parsed = _part_headers(body, at, end)
        if parsed is None:
            return None, False
        headers, start = parsed
        at = after
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind.startswith("multipart/"):
            return None, False
        names = _param_names(headers.get("content-disposition", ""))
        if any(names_a_credential(name) for name in names):
            redacted: bytes | None = MARKER.encode() if end > start else b""
        elif headers.get("content-transfer-encoding", "").lower() not in (
            "", "7bit", "8bit", "binary",
        ):  # fmt: skip
            # Encoded (base64, quoted-printable): what it holds is not what
            # its bytes show, whatever its type says. Not looked into here.
            return None, False
        elif (
            not _BINARY_TYPE.fullmatch(kind or "text/plain")
            or _TEXT_LIKE.search(kind)
            or _like_json(body, start, end)
        ):
            redacted, _ = redact_body(body[start:end], kind or "text/plain")
        else:
            continue  # nothing to look into: kept as it came
        if redacted is None:
            return None, False
        if redacted != body[start:end]:
            out += [body[kept:start], redacted]
            kept = end
            changed = True
    if body.find(marker, at) >= 0:  # past the close delimiter: as in a line
        return None, False
    if not changed:
        return body, False
    return b"".join([*out, body[kept:]]), True


def content_type(headers: Iterable[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.decode("latin-1")
    return ""


def content_encoding(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The codings a body's ``Content-Encoding`` headers name, in the order
    they were applied (``identity`` left out)."""
    return [
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"content-encoding"
        for token in value.decode("latin-1").split(",")
        if token.strip() and token.strip().lower() != "identity"
    ]


# zlib's wbits by coding: gzip's header and trailer, zlib's (RFC 9110's
# "deflate"); raw deflate too, which some servers send as "deflate".
_CODINGS = {"gzip": (31,), "x-gzip": (31,), "deflate": (15, -15)}
# The most content codings undone: a server applies one. Each costs up to
# ``limit`` bytes decompressed, and a client's head may name thousands
# (gzip over stored blocks barely grows a layer): more are not checked, and
# the body is kept by its digest.
MAX_CODINGS = 4


def decoded(body: bytes, codings: list[str], limit: int) -> bytes | None:
    """``body`` with its content codings (``content_encoding``) undone, to
    be checked for credentials: None where a coding is not gzip or deflate,
    the bytes do not decompress whole, or they would grow past ``limit``
    (a small body may decompress to a huge one), or there are more than
    ``MAX_CODINGS`` codings (each could cost ``limit`` bytes of work)."""
    if len(codings) > MAX_CODINGS:
        return None
    for coding in reversed(codings):
        wbits = _CODINGS.get(coding)
        if wbits is None:
            return None
        for bits in wbits:
            decoder = zlib.decompressobj(bits)
            try:
                out = decoder.decompress(body, limit + 1)
            except zlib.error:
                continue
            if decoder.eof and len(out) <= limit and not decoder.unused_data:
                body = out
                break
        else:
            return None
    return body

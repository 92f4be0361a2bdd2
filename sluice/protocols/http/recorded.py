"""What a recording keeps of an HTTP exchange: credentials out, sans-I/O.

``sluice/proxy/http_recording.py`` records each exchange of the HTTP
listener and each frame of a WebSocket session (``http`` and ``ws``
records, docs/recording-format.md); what may be written of a request's
target, headers and bodies is decided here, on values:

- ``redact_target``: a request target (or a URL) with the values of
  credential-like query parameters (``token=``, ``jwt=``, ``api_key=`` …)
  replaced by ``<redacted>``, and a credential set as a broker's dynamic
  config in the path.
- ``redact_headers``: headers as text pairs, the values of those that
  carry credentials (``Authorization``, ``Proxy-Authorization``,
  ``Cookie``, ``Set-Cookie``, ``X-Original-Principal``, anything named like
  a token, key, secret or password) replaced, and URLs in ``Location``
  and ``Referer`` redacted as targets.
- ``redact_body``: a JSON, form or ``multipart/form-data`` body (kept
  whole with ``--record-payloads full``) with the values of credential-like
  keys replaced (each part of a multipart body as its own content type
  says); any other body as it came; None for one that cannot be checked
  (JSON nested too deep, a multipart body that does not parse): a
  recording keeps its digest instead.

Nothing here imports trio.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

MARKER = "<redacted>"
# A header whose value is a credential (or names who holds one).
_SENSITIVE_HEADER = re.compile(
    r"auth|token|passw|secret|credential|key|cookie|session|jwt|signature|principal",
    re.IGNORECASE,
)
# A query parameter or JSON key whose value is a credential: narrower than
# for headers, as Pulsar's own names (``authoritative``, a message's ``key``,
# ``keySharedMode``) are no secrets.
_SENSITIVE_NAME = re.compile(
    r"token|passw|passphrase|pwd|secret|credential|cookie|session|jwt|signature|bearer|"
    r"api[-_]?key|private[-_]?key|access[-_]?key|^auth(?!oritative)|authdata|authorization|"
    # Pulsar's client credentials in a broker's config (dynamic config:
    # brokerClientAuthenticationParameters, bookkeeperClientAuthParams …)
    r"authenticationparam|authparam",
    re.IGNORECASE,
)
# ``pulsar-admin brokers update-dynamic-config`` puts the value in the path:
# ``/admin/v2/brokers/configuration/{name}/{value}``.
_DYNAMIC_CONFIG = re.compile(r"(/admin(?:/v2)?/brokers/configuration/)([^/]+)/(.+)", re.IGNORECASE)
# Headers whose value is a URL: its query is redacted like a target's.
_URL_HEADERS = frozenset({"location", "content-location", "referer", "origin"})


def sensitive(name: str) -> bool:
    """A query parameter or JSON key whose value is not recorded."""
    return bool(_SENSITIVE_NAME.search(name))


def sensitive_header(name: str) -> bool:
    """A header whose value is not recorded (a WebSocket handshake's key
    and accept values are nonces, not credentials; its subprotocols may
    be one, as browsers, which cannot set ``Authorization`` on a WebSocket,
    send a token there)."""
    lower = name.lower()
    if lower == "sec-websocket-protocol":
        return True
    return not lower.startswith("sec-websocket-") and bool(_SENSITIVE_HEADER.search(lower))


def _redact_query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, eq, _ = part.partition("=")
        if eq and sensitive(urllib.parse.unquote_plus(name)):
            part = f"{name}={MARKER}"
        parts.append(part)
    return "&".join(parts)


def redact_target(target: bytes | str) -> str:
    """A request target or URL as text, credential-like query values
    replaced (the rest of it as it came); user information in an absolute
    URL is replaced too, and the value a broker's dynamic config is set to
    in the path (``/admin/v2/brokers/configuration/{name}/{value}``) where
    the name is a credential's."""
    text = target.decode("latin-1") if isinstance(target, bytes) else target
    text, hash_, fragment = text.partition("#")
    base, q, query = text.partition("?")
    if "://" in base:
        scheme, _, rest = base.partition("://")
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            authority = f"{MARKER}@{authority.rpartition('@')[2]}"
        base = f"{scheme}://{authority}{slash}{path}"
    config = _DYNAMIC_CONFIG.search(base)
    if config is not None and sensitive(urllib.parse.unquote(config.group(2))):
        base = f"{base[: config.start(3)]}{MARKER}"
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


def _scrub(value: Any, depth: int = 0) -> tuple[Any, bool]:
    """A JSON value with credential-like keys' values replaced; whether any
    were. ``_TooDeep`` past ``MAX_DEPTH`` levels."""
    if depth > MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and sensitive(key) and item not in (None, "", MARKER):
                out[key], changed = MARKER, True
            else:
                out[key], inner = _scrub(item, depth + 1)
                changed = changed or inner
        return out, changed
    if isinstance(value, list):
        items = [_scrub(item, depth + 1) for item in value]
        return [i for i, _ in items], any(c for _, c in items)
    return value, False


def redact_body(body: bytes, content_type: str = "") -> tuple[bytes | None, bool]:
    """A body to keep whole, and whether credentials were replaced in it: a
    JSON document's credential-like keys, a form's credential-like fields,
    each part of a ``multipart/form-data`` body as its own type says (and
    the whole value of a part named like a credential). Another body is
    kept as it came. None: a body that cannot be checked for credentials
    (JSON nested too deep, a multipart body that does not parse), not to be
    kept (its digest is)."""
    if content_type.lower().lstrip().startswith("multipart/"):
        return _redact_multipart(body, content_type)
    start = body.lstrip()[:1]
    if start in (b"{", b"["):
        try:
            document = json.loads(body)
            scrubbed, changed = _scrub(document)
        except (RecursionError, _TooDeep):
            return None, False
        except (ValueError, UnicodeDecodeError):
            return body, False
        if not changed:
            return body, False
        return json.dumps(scrubbed, separators=(",", ":")).encode(), True
    if "x-www-form-urlencoded" in content_type.lower():
        try:
            text = body.decode("ascii")
        except UnicodeDecodeError:
            return body, False
        redacted = _redact_query(text)
        return redacted.encode(), redacted != text
    return body, False


def _redact_multipart(body: bytes, content_type: str) -> tuple[bytes | None, bool]:
    """A multipart body (``pulsar-admin`` sends functions', sources' and
    sinks' configs as ``multipart/form-data``), parsed by the stdlib's
    ``email`` parser, each part redacted as its own content type says and
    written back in its place; the rest of the body as it came. None where
    the body does not parse whole or a part's bytes cannot be found again
    (a transfer encoding, a nested multipart)."""
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    try:
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        boundary = message.get_boundary()
        if message.defects or not message.is_multipart() or not boundary:
            return None, False
        delimiter = b"\n--" + boundary.encode("latin-1")
        out: list[bytes] = []
        at = 0  # how much of the body is in ``out`` already
        changed = False
        for part in message.iter_parts():
            payload = part.get_payload(decode=True)
            if part.defects or part.is_multipart() or not isinstance(payload, bytes):
                return None, False
            name = part.get_param("name", header="content-disposition")
            if isinstance(name, str) and sensitive(name) and payload:
                redacted: bytes | None = MARKER.encode()
            else:
                redacted, _ = redact_body(payload, part.get_content_type())
            if redacted is None:
                return None, False
            end = body.find(payload + b"\r" + delimiter, at)
            if end < 0:
                end = body.find(payload + delimiter, at)
            if end < 0:
                return None, False
            out += [body[at:end], redacted]
            at = end + len(payload)
            changed = changed or redacted != payload
    except Exception:  # the stdlib's parser on any bytes: not checked, so not kept
        return None, False
    if not changed:
        return body, False
    return b"".join([*out, body[at:]]), True


def content_type(headers: Iterable[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.decode("latin-1")
    return ""

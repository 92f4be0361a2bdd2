"""An HTTP exchange's record (``http``) with its credentials out, for
``sluice record anonymize``: as ``recorded.py`` would have written it.

A capture written by an older Sluice kept ``Authorization`` headers,
``?token=`` queries and the like as they came; the anonymizer passes every
``http`` record through ``redacted_record`` before it replaces names, so
the copy holds none of them whatever recorded it. The path, each redirect
hop's URL and target (``redact_target``) and both sides' headers
(``redact_headers``, which redacts ``Location`` and ``Referer`` URLs too)
are redacted as the recorder redacts them; bodies are the anonymizer's
(it never keeps one). Nothing here imports trio.
"""

from __future__ import annotations

from typing import Any

from sluice.protocols.http.recorded import redact_headers, redact_target


def redacted_record(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of an ``http`` record with the credentials of its path, hops
    and headers replaced by ``<redacted>`` (``redacted`` set when any were)."""
    out = dict(record)
    changed = False
    if isinstance(out.get("path"), str):
        out["path"] = redact_target(out["path"])
        changed = out["path"] != record["path"]
    hops = out.get("hops")
    if isinstance(hops, list):
        out["hops"] = [
            [redact_target(part) if isinstance(part, str) else part for part in hop]
            if isinstance(hop, list)
            else hop
            for hop in hops
        ]
        changed = changed or out["hops"] != hops
    for side in ("req", "res"):
        part = out.get(side)
        if isinstance(part, dict) and isinstance(part.get("h"), list):
            headers = [_header(h) for h in part["h"]]
            if headers != part["h"]:
                out[side] = {**part, "h": headers}
                changed = True
    if changed:
        out["redacted"] = True
    return out


def _header(header: Any) -> Any:
    """One ``[name, value]`` pair as ``redact_headers`` writes it (any other
    shape, which no reader takes as a header, left to the anonymizer)."""
    if not (isinstance(header, list) and len(header) == 2):
        return header
    name, value = header
    if not (isinstance(name, str) and isinstance(value, str)):
        return header
    # A recorder wrote headers decoded as latin-1; a hand-made or damaged
    # record may hold other characters, which UTF-8 carries there and back.
    encoding = "latin-1" if _latin1(name + value) else "utf-8"
    [[_, shown]] = redact_headers([(name.encode(encoding), value.encode(encoding))])
    shown = shown.encode("latin-1").decode(encoding, "replace")
    return header if shown == value else [name, shown]


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True

"""An admin token that is not ASCII (the token file is UTF-8 text) is
taken when sent as it is: the request head is read as Latin-1, so the
token's UTF-8 bytes must be compared as bytes, not read as Latin-1
characters and encoded again (which never matched: every change refused
with 401, though the right token was sent; with --workers, every change
the supervisor passed on to its workers, which it sends UTF-8)."""

from __future__ import annotations

import pytest
import trio.testing

from sluice.proxy.admin import Refused, _read_request, authorize

TOKEN = "pässwörd-トークン"


async def _authorize(sent: bytes, token: str = TOKEN) -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"POST /faults HTTP/1.1\r\nAuthorization: Bearer " + sent + b"\r\n\r\n")
    request = await _read_request(server)  # type: ignore[arg-type]
    assert request is not None
    authorize(request, token, "changing fault rules")


async def test_a_token_beyond_ascii_is_taken() -> None:
    await _authorize(TOKEN.encode())


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
async def test_a_latin_1_token_is_taken_as_either_client_sends_it(encoding: str) -> None:
    # sluice faults (http.client) sends Latin-1; curl and the supervisor UTF-8.
    await _authorize("pässwörd".encode(encoding), "pässwörd")


@pytest.mark.parametrize("sent", ["pässwörd-トークン".encode("latin-1", "replace"), b"p\xe4ssw"])
async def test_other_bytes_are_still_refused(sent: bytes) -> None:
    with pytest.raises(Refused) as info:
        await _authorize(sent)
    assert info.value.status == 401


@pytest.mark.parametrize("token", ["déjà", "ÅÅ", "ā-Ġ"])
async def test_a_token_whose_utf_8_ends_in_a_byte_latin_1_reads_as_space_is_taken(
    token: str,
) -> None:
    # 'à' is C3 A0 in UTF-8, 'Å' C3 85, 'Ġ' C4 A0: read as Latin-1 the last
    # byte is NBSP or NEL, which str.strip() takes for whitespace; HTTP's
    # is only spaces and tabs, and the token's bytes must stay whole.
    await _authorize(token.encode(), token)
    await _authorize(b"  " + token.encode() + b" \t", token)

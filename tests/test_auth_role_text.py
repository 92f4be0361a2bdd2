"""A role that is not text: a JSON string may hold a lone UTF-16 surrogate
(``"\\ud800"``), which PyJWT reads into a Python string that no protobuf
string field (``original_principal``) and no header can carry. Signed into
a token by the key or an issuer (a role claim some identity providers let
users write), it is refused as a bad credential, as the broker's error
for one, not accepted and left to break the CONNECT Sluice sends for it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import hs256_token
from sluice.protocols.core import Authenticated, Close, OpenUpstream
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.auth import AuthError
from tests.test_auth_roles import SECRET as WEB_SECRET
from tests.test_auth_roles import proxy_auth
from tests.test_proxy_auth import SECRET, own_frames, proxy_core
from tests.test_pulsar_core import connect_body, frame_bytes

ROLE = "app\ud800"


@pytest.mark.parametrize("relayed", [True, False])
def test_a_role_with_a_lone_surrogate_is_refused_at_connect(relayed: bool, tmp_path: Path) -> None:
    """Before, the token was accepted (``Authenticated ok``) and the relayed
    CONNECT to the broker raised UnicodeEncodeError in the core: the
    connection ended as an internal error, the client told nothing."""
    core, rec = proxy_core(tmp_path)
    token = hs256_token(SECRET, ROLE, time.time() + 60)
    where = {"proxy_to_broker_url": "127.0.0.1:6650"} if relayed else {}
    connect = connect_body(auth_method_name="token", auth_data=token.encode(), **where)
    out = core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    assert not any(isinstance(a, OpenUpstream) for a in out)
    (error,) = own_frames(out)
    assert error.name == "ERROR" and error.body.error == pb.AuthenticationError
    assert isinstance(out[-1], Close) and out[-1].reason == "auth"
    assert Authenticated("token", "failed") in rec.events
    assert Authenticated("token", "ok") not in rec.events


def test_a_role_with_a_lone_surrogate_is_refused_on_the_web_port(tmp_path: Path) -> None:
    auth = proxy_auth(tmp_path)
    token = hs256_token(WEB_SECRET, ROLE, time.time() + 60)
    with pytest.raises(AuthError, match="not text"):
        auth.web_credentials(f"Bearer {token}", None)

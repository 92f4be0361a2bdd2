"""``--auth-mode proxy --forward-auth-data``: a broker that checks the
client's forwarded token (``authenticateOriginalAuthData``) refreshes that
token when it expires, with AUTH_CHALLENGE ``PulsarAuthRefresh`` on the
connection Sluice logged in on, and refuses an answer of another role (it
closes the connection: "Principal cannot change during an authentication
refresh"). Sluice gets the client's fresh token, as Apache Pulsar's proxy
does (ProxyClientCnx), and checks it as at CONNECT before it goes to the
broker: the same verifier, the same role. Driven through the sans-I/O core."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sluice.brokers.apache_pulsar import hs256_token
from sluice.protocols.core import Action, Authenticated, Close, OpenUpstream, Peer, Send
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.auth import REFRESH
from sluice.protocols.pulsar.connection import PulsarConnection
from tests.test_proxy_auth import SECRET, proxy_core
from tests.test_pulsar_core import Recording, connect_body, frame_bytes, sent

OWN = hs256_token(SECRET, "sluice").encode()  # Sluice's own token (proxy_core's file)


def relayed(tmp_path: Path, token: str, **options: Any) -> tuple[PulsarConnection, Recording, str]:
    """A client relayed to its broker through Sluice, connected."""
    core, rec = proxy_core(tmp_path, **options)
    connect = connect_body(auth_method_name="token", auth_data=token.encode(),
                           proxy_to_broker_url="127.0.0.1:6650")  # fmt: skip
    (opened,) = core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    assert isinstance(opened, OpenUpstream)
    connected = pb.CommandConnected(server_version="broker", protocol_version=21)
    core.receive_broker(frame_bytes("CONNECTED", connected), 0.1)
    return core, rec, token


def broker_refresh(method: str = "token") -> bytes:
    challenge = pb.AuthData(auth_method_name=method, auth_data=REFRESH)
    return frame_bytes("AUTH_CHALLENGE", pb.CommandAuthChallenge(challenge=challenge))


def answer(token: str) -> bytes:
    data = pb.AuthData(auth_method_name="token", auth_data=token.encode())
    return frame_bytes("AUTH_RESPONSE", pb.CommandAuthResponse(response=data))


def auth_data_to_broker(actions: list[Action]) -> list[bytes]:
    return [f.body.response.auth_data for f in sent(actions, Peer.BROKER)
            if f.name == "AUTH_RESPONSE"]  # fmt: skip


def test_the_brokers_refresh_gets_the_clients_fresh_token_once_verified(
    tmp_path: Path,
) -> None:
    core, rec, _ = relayed(tmp_path, hs256_token(SECRET, "app", time.time() + 1),
                           forward_auth_data=True)  # fmt: skip
    # The client's token expired (at the broker, and at Sluice: core time
    # 5.0 is past its second): Sluice asks the client, the broker waits.
    out = core.receive_broker(broker_refresh(), 5.0)
    assert auth_data_to_broker(out) == []
    (challenge,) = sent(out, Peer.CLIENT)
    assert challenge.name == "AUTH_CHALLENGE"
    assert challenge.body.challenge.auth_data == REFRESH
    # A fresh token of the same role: verified, then the broker's answer.
    fresh = hs256_token(SECRET, "app", time.time() + 600)
    out = core.receive_client(answer(fresh), 5.5)
    assert auth_data_to_broker(out) == [fresh.encode()]
    (response,) = sent(out, Peer.BROKER)
    assert response.body.response.auth_method_name == "token"
    assert not any(isinstance(a, Close) for a in out)
    assert rec.of(Authenticated)[-1] == Authenticated("token", "refreshed")
    # The broker asking again about the token it holds (its clock is ahead
    # of Sluice's): not that token again, the client is asked once more.
    again = core.receive_broker(broker_refresh(), 9.0)
    assert auth_data_to_broker(again) == []
    assert [f.name for f in sent(again, Peer.CLIENT)] == ["AUTH_CHALLENGE"]


def refused_like_a_bad_connect(out: list[Action], rec: Recording) -> Close:
    """What a CONNECT with a bad token gets: ERROR AuthenticationError
    "Failed to authenticate", the connection closed for "auth", counted as
    failed; and nothing of the client's goes to the broker."""
    assert auth_data_to_broker(out) == []
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR" and error.body.error == pb.AuthenticationError
    assert error.body.message == "Failed to authenticate"
    assert isinstance(out[-1], Close) and out[-1].reason == "auth"
    assert rec.of(Authenticated)[-1] == Authenticated("token", "failed")
    return out[-1]


def test_a_forged_refreshed_token_is_refused_and_never_reaches_the_broker(
    tmp_path: Path,
) -> None:
    core, rec, _ = relayed(tmp_path, hs256_token(SECRET, "app", time.time() + 1),
                           forward_auth_data=True)  # fmt: skip
    core.receive_broker(broker_refresh(), 5.0)
    forged = hs256_token(b"k" * 32, "app", time.time() + 600)
    out = core.receive_client(answer(forged), 5.5)
    assert "bad signature" in refused_like_a_bad_connect(out, rec).message


def test_a_refreshed_token_of_another_role_is_refused(tmp_path: Path) -> None:
    core, rec, _ = relayed(tmp_path, hs256_token(SECRET, "app", time.time() + 1),
                           forward_auth_data=True)  # fmt: skip
    core.receive_broker(broker_refresh(), 5.0)
    admin = hs256_token(SECRET, "admin", time.time() + 600)
    out = core.receive_client(answer(admin), 5.5)
    assert "role 'admin', not 'app'" in refused_like_a_bad_connect(out, rec).message


def test_a_token_sluice_refreshed_already_answers_the_broker_at_once(tmp_path: Path) -> None:
    core, _, first = relayed(tmp_path, hs256_token(SECRET, "app", time.time() + 1),
                             forward_auth_data=True)  # fmt: skip
    # Sluice's own refresh (its keepalive found the token expired) came first.
    (challenge,) = sent(core.keepalive(3.0, 10.0), Peer.CLIENT)
    assert challenge.name == "AUTH_CHALLENGE"
    fresh = hs256_token(SECRET, "app", time.time() + 600)
    assert auth_data_to_broker(core.receive_client(answer(fresh), 3.5)) == []
    # Then the broker's: the verified token, without asking the client again.
    out = core.receive_broker(broker_refresh(), 6.0)
    assert auth_data_to_broker(out) == [fresh.encode()] != [first.encode()]
    assert sent(out, Peer.CLIENT) == []


def test_the_brokers_challenge_of_sluices_own_login_is_answered_with_sluices_token(
    tmp_path: Path,
) -> None:
    """Without --forward-auth-data the broker holds no token of the
    client's: any challenge is about Sluice's login. With it, one that is
    not a refresh is too."""
    token = hs256_token(SECRET, "app", time.time() + 600)
    for options, challenge in (
        ({}, broker_refresh()),
        ({"forward_auth_data": True}, frame_bytes("AUTH_CHALLENGE", pb.CommandAuthChallenge(
            challenge=pb.AuthData(auth_method_name="token", auth_data=b"step 2"))),),
    ):  # fmt: skip
        core, _, _ = relayed(tmp_path, token, **options)
        out = core.receive_broker(challenge, 1.0)
        assert auth_data_to_broker(out) == [OWN]
        assert sent(out, Peer.CLIENT) == []


def test_frames_the_client_sent_before_its_answer_reach_the_broker_first(
    tmp_path: Path,
) -> None:
    core, _, _ = relayed(tmp_path, hs256_token(SECRET, "app", time.time() + 1),
                         forward_auth_data=True)  # fmt: skip
    core.receive_broker(broker_refresh(), 5.0)
    fresh = hs256_token(SECRET, "app", time.time() + 600)
    ping = frame_bytes("PING", pb.CommandPing())
    out = core.receive_client(ping + answer(fresh), 5.5)
    to_broker = [a.data for a in out if isinstance(a, Send) and a.to is Peer.BROKER]
    assert [f.name for f in sent(out, Peer.BROKER)] == ["PING", "AUTH_RESPONSE"]
    assert to_broker[0] == ping

"""Configuration reload, in process: the settings read again from the same
command line and a changed --config file, what is put in force, what is
kept (named), what is refused (as a whole, one line a mistake), and the
admin endpoint's answer. Under load against Apache Pulsar, with workers
and through the chart: tests/test_reload_e2e.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from sluice.brokers.apache_pulsar import hs256_token
from sluice.commands.proxy import settings_again
from sluice.protocols import registry
from sluice.protocols.faults import parse_rule
from sluice.protocols.pulsar.auth import AuthError
from sluice.proxy.admin import AdminRequest, ConfigEndpoint, Refused
from sluice.proxy.reload import LIVE, effective, flags, held, split
from sluice.proxy.server import Proxy

BROKER = "pulsar://127.0.0.1:6650"


def write(path: Path, **settings: Any) -> Path:
    lines = [f"{k.replace('_', '-')} = {json.dumps(v)}" for k, v in settings.items()]
    path.write_text("\n".join(["[proxy]", *lines]) + "\n")
    return path


def argv(config: Path, *extra: str) -> list[str]:
    return ["proxy", "--broker", BROKER, "--listen", "127.0.0.1:0", "--config", str(config),
            *extra]  # fmt: skip


def test_what_a_reload_may_change_and_what_it_keeps(tmp_path: Path) -> None:
    cfg = write(tmp_path / "sluice.toml", max_connections=100, allow_broker=["10.0.0.0/8"])
    line = argv(cfg)
    old = settings_again(line)
    write(cfg, max_connections=50, allow_broker=["10.0.0.0/8", "*.brokers.test"],
          listen="127.0.0.1:7000", keepalive_interval=5)  # fmt: skip
    new = settings_again(line)
    live, kept = split(old, new)
    assert sorted(live) == ["allow_broker", "max_connections"]
    # The command line wins over the file, so --listen is not changed by it;
    # the keepalive interval needs a restart.
    assert kept == ["keepalive_interval"]
    now = effective(old, new, kept)
    assert now.max_connections == 50 and now.keepalive_interval == old.keepalive_interval
    assert {"allow_broker", "faults", "filters", "auth_oidc_issuers"} <= LIVE
    assert "listen" not in LIVE and "workers" not in LIVE
    # Recorder settings other than the snapshot rules are kept, named by --record.
    assert flags(["record", "snapshot_on"]) == ["--record", "--snapshot-on"]
    # A rotated admin token needs a restart: said by the flag that names it.
    assert flags(["admin_token"]) == ["--admin-token-file"]


def with_a_delay_rule(tmp_path: Path) -> tuple[Proxy, Path, Path]:
    """A proxy whose configuration (100 connections) names a rules file of
    one delay rule, "slow", reloaded from them: it, the config file, the
    rules file."""
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"id": "slow", "match": {"command": "SEND"},
                                  "action": "delay", "delay_ms": 5}]))  # fmt: skip
    cfg = write(tmp_path / "sluice.toml", max_connections=100, faults=str(rules))
    line = argv(cfg)
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    return proxy, cfg, rules


async def test_a_reload_is_put_in_force_kept_or_refused_as_a_whole(tmp_path: Path) -> None:
    proxy, cfg, rules = with_a_delay_rule(tmp_path)
    assert proxy.generation.number == 1
    assert [r.id for r in proxy.faults.rules] == ["slow"]
    # A rule added at the admin endpoint stays through reloads.
    proxy.faults.add(parse_rule({"id": "mine", "action": "drop"}, registry.all_faults()))

    # Nothing changed: no new generation.
    same = await proxy.reload_from_source("SIGHUP")
    assert same.outcome == "unchanged" and same.generation.number == 1
    # Said as this reload's trigger, not the one of the generation in force
    # (an unchanged SIGHUP was logged as "configuration reload (admin)").
    in_force = proxy.generation.source
    assert same.summary().startswith("configuration reload (SIGHUP): unchanged")
    watched = await proxy.reload_from_source("file")
    assert watched.summary().startswith("configuration reload (file): unchanged")
    assert proxy.generation.source == in_force != "file"

    # Limits and fault rules change live; a listener is named and kept.
    rules.write_text(json.dumps([{"id": "slower", "match": {"command": "SEND"},
                                  "action": "delay", "delay_ms": 50}]))  # fmt: skip
    write(cfg, max_connections=7, faults=str(rules), handshake_timeout=3)
    applied = await proxy.reload_from_source("file")
    assert applied.outcome == "applied", applied
    assert applied.generation.number == 2 and applied.generation.source == "file"
    assert sorted(applied.changed) == ["--faults", "--max-connections"]
    assert applied.kept == ["--handshake-timeout"]
    assert proxy.limits.total == 7
    assert sorted(r.id for r in proxy.faults.rules) == ["mine", "slower"]

    # Refused as a whole: a bad value and an unreadable key file, one line
    # each time; the configuration in force stays.
    write(cfg, max_connections="lots", max_redirects="many", faults=str(rules))
    refused = await proxy.reload_from_source("admin")
    assert refused.outcome == "refused" and refused.generation.number == 2
    assert len(refused.errors) == 2, refused.errors  # one line per mistake
    assert "max-connections" in refused.errors[0] and "max-redirects" in refused.errors[1]
    write(cfg, max_connections=9, faults=str(rules), auth_mode="proxy",
          auth_token_secret_key=str(tmp_path / "missing.key"),
          broker_auth_token_file=str(tmp_path / "missing.token"))  # fmt: skip
    refused = await proxy.reload_from_source("admin")
    assert refused.outcome == "refused", refused
    assert refused.errors == [f"--auth-token-secret-key {tmp_path / 'missing.key'}: "
                              "No such file or directory"]  # fmt: skip
    assert proxy.limits.total == 7 and proxy.config.auth_mode == "passthrough"
    assert proxy.generation.number == 2

    # The admin endpoint: the generation, and a reload behind the token.
    endpoint = ConfigEndpoint(proxy.generation_json, proxy._reload_json, "t0ken")
    status, body = await endpoint(AdminRequest("GET", "/config", {}, b""))
    assert status == 200 and body["generation"] == 2 and body["source"] == "file"
    with pytest.raises(Refused) as denied:
        await endpoint(AdminRequest("POST", "/config/reload", {}, b""))
    assert denied.value.status == 401
    write(cfg, max_connections=9, faults=str(rules))
    status, body = await endpoint(
        AdminRequest("POST", "/config/reload", {"authorization": "Bearer t0ken"}, b"")
    )
    assert status == 200 and body["outcome"] == "applied" and body["generation"] == 3
    write(cfg, max_connections=[], faults=str(rules))
    status, body = await endpoint(
        AdminRequest("POST", "/config/reload", {"authorization": "Bearer t0ken"}, b"")
    )
    assert status == 400 and body["outcome"] == "refused" and body["errors"]


async def test_a_reload_that_leaves_the_fault_rules_as_they_are_leaves_them_alone(
    tmp_path: Path,
) -> None:
    """Another live setting changed: the configuration's rules keep their
    counts, and what their delays hold is not let go (they were removed and
    added again, at every reload)."""
    proxy, cfg, rules = with_a_delay_rule(tmp_path)
    (slow,) = proxy.faults.rules
    slow.hits, epoch = 3, proxy.faults.epoch
    write(cfg, max_connections=8, faults=str(rules))
    assert (await proxy.reload_from_source("file")).changed == ["--max-connections"]
    assert [r.hits for r in proxy.faults.rules] == [3] and proxy.faults.epoch == epoch


async def test_a_rules_file_changed_in_one_rule_leaves_the_others_alone(tmp_path: Path) -> None:
    """A rule added to the --faults file: the rules it holds unchanged keep
    their counts (a `times 1` rule that fired does not fire again) and
    their holds; only the new one is added. (Every rule of the file was
    removed and added again.)"""
    proxy, _, rules = with_a_delay_rule(tmp_path)
    (slow,) = proxy.faults.rules
    slow.hits = 3
    rules.write_text(json.dumps([
        {"id": "slow", "match": {"command": "SEND"}, "action": "delay", "delay_ms": 5},
        {"id": "drop", "match": {"command": "PING"}, "action": "drop"},
    ]))  # fmt: skip
    done = await proxy.reload_from_source("file")
    assert done.outcome == "applied", done
    assert [(r.id, r.hits) for r in proxy.faults.rules] == [("slow", 3), ("drop", 0)]
    assert proxy.faults.rules[0] is slow
    # Changed, a rule is the new one, counting from zero.
    rules.write_text(json.dumps([
        {"id": "slow", "match": {"command": "SEND"}, "action": "delay", "delay_ms": 50},
    ]))  # fmt: skip
    assert (await proxy.reload_from_source("file")).outcome == "applied"
    assert [(r.id, r.hits, r.delay_ms) for r in proxy.faults.rules] == [("slow", 0, 50)]


async def test_with_workers_a_rules_file_changed_in_one_rule_leaves_the_others_alone(
    tmp_path: Path,
) -> None:
    """The supervisor's side: only the rules gone or changed are taken from
    the workers (a DELETE each, which drops a rule's counts there), only
    new or changed ones given (it deleted and posted every rule)."""
    from sluice.proxy.workers import Supervisor

    _, cfg, rules = with_a_delay_rule(tmp_path)
    line = argv(cfg)
    supervisor = Supervisor(settings_again(line), 2)
    told: list[tuple[str, str]] = []

    async def to_workers(method: str, path: str, body: object = None) -> None:
        told.append((method, path))

    supervisor._to_workers = to_workers  # type: ignore[method-assign]
    old = supervisor.config
    rules.write_text(json.dumps([
        {"id": "slow", "match": {"command": "SEND"}, "action": "delay", "delay_ms": 5},
        {"id": "drop", "match": {"command": "PING"}, "action": "drop"},
    ]))  # fmt: skip
    try:
        await supervisor._replace_config_rules(old, settings_again(line))
    finally:
        shutil.rmtree(supervisor._state)
    assert told == [("POST", "/faults")]
    assert [r["id"] for r in supervisor.rules] == ["slow", "drop"]


DROP_SEND = {"id": "a", "match": {"command": "SEND"}, "action": "drop"}
DELAY_SEND = {"id": "b", "match": {"command": "SEND"}, "action": "delay", "delay_ms": 5}


async def test_a_rules_file_keeps_its_order_through_reloads(tmp_path: Path) -> None:
    """The first rule that fires acts: a file reordered is tried in its new
    order, and a rule changed keeps its place before the rules after it.
    (Kept rules stayed where they were: reordered, SENDs were still
    dropped; `a` changed went behind `b` and never fired.)"""
    proxy, _, rules = with_a_delay_rule(tmp_path)
    rules.write_text(json.dumps([DROP_SEND, DELAY_SEND]))
    assert (await proxy.reload_from_source("file")).outcome == "applied"
    assert [r.id for r in proxy.faults.rules] == ["a", "b"]
    rules.write_text(json.dumps([DELAY_SEND, DROP_SEND]))
    assert (await proxy.reload_from_source("file")).outcome == "applied"
    assert [r.id for r in proxy.faults.rules] == ["b", "a"]
    rules.write_text(json.dumps([{**DROP_SEND, "times": 3}, DELAY_SEND]))
    assert (await proxy.reload_from_source("file")).outcome == "applied"
    assert [r.id for r in proxy.faults.rules] == ["a", "b"]


async def test_with_workers_a_rules_file_keeps_its_order_through_reloads(tmp_path: Path) -> None:
    from sluice.proxy.workers import Supervisor

    _, cfg, rules = with_a_delay_rule(tmp_path)
    rules.write_text(json.dumps([DROP_SEND, DELAY_SEND]))
    line = argv(cfg)
    supervisor = Supervisor(settings_again(line), 2)
    told: list[tuple[str, str]] = []

    async def to_workers(method: str, path: str, body: object = None) -> None:
        told.append((method, path))

    supervisor._to_workers = to_workers  # type: ignore[method-assign]
    try:
        old = supervisor.config
        rules.write_text(json.dumps([DELAY_SEND, DROP_SEND]))
        new = settings_again(line)
        await supervisor._replace_config_rules(old, new)
        assert [r["id"] for r in supervisor.rules] == ["b", "a"]
        # A rule kept in place stays; from the first that moved, all go again.
        assert told == [("DELETE", "/faults/a"), ("DELETE", "/faults/b"),
                        ("POST", "/faults"), ("POST", "/faults")]  # fmt: skip
        told.clear()
        rules.write_text(json.dumps([DELAY_SEND, {**DROP_SEND, "times": 3}]))
        await supervisor._replace_config_rules(new, settings_again(line))
        assert told == [("DELETE", "/faults/a"), ("POST", "/faults")]
    finally:
        shutil.rmtree(supervisor._state)


async def test_a_key_file_rewritten_under_its_name_is_read_again(tmp_path: Path) -> None:
    """A key rotated in place (a Kubernetes Secret's file is replaced under
    its name) is a change: the reload puts the new key in force, and a
    token signed with the old one, perhaps leaked, is refused from then
    on. (The settings compared equal, paths and all: "unchanged", and the
    old key stayed in force.) Nothing rewritten: unchanged, as before."""
    key, own = tmp_path / "secret.key", tmp_path / "own.token"
    old_key, new_key = b"o" * 32, b"n" * 32
    key.write_bytes(old_key)
    own.write_text(hs256_token(old_key, "sluice"))
    auth = ["--auth-mode", "proxy", "--auth-token-secret-key", str(key)]
    line = argv(write(tmp_path / "sluice.toml"), *auth, "--broker-auth-token-file", str(own))
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)

    def role(token: str) -> str:
        auth = proxy.backend.settings.auth  # type: ignore[attr-defined]
        try:
            return str(auth.authenticate("token", token.encode(), None).role)
        except AuthError as exc:
            return f"refused: {exc}"

    old, new = hs256_token(old_key, "mallory"), hs256_token(new_key, "alice")
    assert (role(old), role(new)) == ("mallory", "refused: bad signature")
    assert (await proxy.reload_from_source("SIGHUP")).outcome == "unchanged"
    key.write_bytes(new_key)
    rotated = await proxy.reload_from_source("SIGHUP")
    assert rotated.outcome == "applied" and rotated.changed == ["--auth-token-secret-key"]
    assert (role(old), role(new)) == ("refused: bad signature", "alice")
    assert (await proxy.reload_from_source("SIGHUP")).outcome == "unchanged"
    # What split is told the files held makes the difference.
    config = proxy.config
    assert split(config, config, held(config), held(config)) == ([], [])
    assert split(config, config, {"auth_token_secret_key": "a"}, {}) == (
        ["auth_token_secret_key"],
        [],
    )


async def test_a_setting_its_checks_let_through_is_refused_not_raised(tmp_path: Path) -> None:
    """A URL with a stray bracket (urlsplit's ValueError) or TOML nested past
    Python's limit is refused as a whole, in one line, as any mistake is.
    (It ended the running proxy: the file watcher's reload raised.)"""
    cfg = write(tmp_path / "sluice.toml", max_connections=100)
    line = argv(cfg)
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    write(cfg, max_connections=100, broker_http="http://[::1:8080")
    refused = await proxy.reload_from_source("file")
    assert refused.outcome == "refused" and len(refused.errors) == 1, refused.errors
    assert "does not check out" in refused.errors[0]
    cfg.write_text("[proxy]\nx = " + "{a = " * 2000 + "1" + "}" * 2000 + "\n")
    refused = await proxy.reload_from_source("file")
    assert refused.outcome == "refused" and refused.errors == [
        f"--config {cfg}: not valid TOML: nested too deep"
    ]
    assert proxy.generation.number == 1 and proxy.config.max_connections == 100


async def test_a_reload_that_takes_a_while_is_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload may take longer than a request may to arrive (an issuer's
    keys fetched, every worker waited for): POST /config/reload is answered
    when it is done. (It was cut off at the request's limit: no answer.)"""
    from prometheus_client import CollectorRegistry

    from sluice.addresses import Address
    from sluice.proxy import admin
    from tests.test_faults import http

    monkeypatch.setattr(admin, "TIMEOUT", 0.3)  # a request's limit, made short

    async def slow_reload() -> dict[str, Any]:
        await trio.sleep(1.0)
        return {"outcome": "applied"}

    endpoint = ConfigEndpoint(dict, slow_reload, "t0ken")
    listeners = await admin.open_admin(Address("127.0.0.1", 0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(admin.serve_admin, listeners, CollectorRegistry(), list,
                           {"/config": endpoint})  # fmt: skip
        with trio.fail_after(10):
            status, text = await http(admin.bound(listeners), "POST", "/config/reload", b"",
                                      token="t0ken")  # fmt: skip
        nursery.cancel_scope.cancel()
    assert status == 200 and json.loads(text)["outcome"] == "applied"


async def test_sighup_and_a_changed_file_reload(tmp_path: Path) -> None:
    """The file is looked at every CONFIG_CHECK_EVERY; a ConfigMap's file is
    a link the kubelet swaps to a new file."""
    import os
    import signal

    from sluice.proxy import server

    data = tmp_path / "..2026_11_29_01"
    data.mkdir()
    write(data / "sluice.toml", max_connections=100)
    (tmp_path / "..data").symlink_to(data.name)
    cfg = tmp_path / "sluice.toml"
    cfg.symlink_to("..data/sluice.toml")
    line = argv(cfg)
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    server.CONFIG_CHECK_EVERY, before = 0.05, server.CONFIG_CHECK_EVERY
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.reload_when_asked, proxy, cfg)  # SIGHUP caught
            # The file watch has taken its first look (what a change is from)
            # once every task waits: a fixed sleep may end before it has.
            await trio.testing.wait_all_tasks_blocked()
            # The kubelet's update: a new directory, the ..data link swapped.
            fresh = tmp_path / "..2026_11_29_02"
            fresh.mkdir()
            write(fresh / "sluice.toml", max_connections=42)
            (tmp_path / "..data.tmp").symlink_to(fresh.name)
            os.replace(tmp_path / "..data.tmp", tmp_path / "..data")
            with trio.fail_after(5):
                while proxy.generation.number != 2:
                    await trio.sleep(0.02)
            assert proxy.limits.total == 42 and proxy.generation.source == "file"
            write(fresh / "sluice.toml", max_connections=43)
            os.utime(fresh / "sluice.toml", (1, 1))  # the file watch sees it too; SIGHUP first
            os.kill(os.getpid(), signal.SIGHUP)
            with trio.fail_after(5):
                while proxy.limits.total != 43:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    finally:
        server.CONFIG_CHECK_EVERY = before


async def test_an_issuer_whose_keys_cannot_be_fetched_is_refused_by_a_reload(
    tmp_path: Path,
) -> None:
    """A reload naming a new OpenID Connect issuer fetches its keys before
    putting it in force: one whose keys cannot be fetched (here its
    discovery document is a 404) refuses the reload, saying why, and the
    issuer in force stays; one that can is applied. (The new issuer was
    put in force first, and every client of it refused after.)"""
    from tests.helpers.support import https_answers
    from tests.test_oidc import Issuer

    idp = Issuer()

    def answer(base: str, path: str) -> bytes | None:
        return {
            "/good/.well-known/openid-configuration": json.dumps(
                {"issuer": f"{base}/good", "jwks_uri": f"{base}/good/jwks.json"}
            ).encode(),
            "/also/.well-known/openid-configuration": json.dumps(
                {"issuer": f"{base}/also", "jwks_uri": f"{base}/good/jwks.json"}
            ).encode(),
            "/good/jwks.json": idp.jwks(),
        }.get(path)

    with https_answers(tmp_path, answer) as (base, ca):
        await _an_issuer_refused_then_one_applied(tmp_path, base, ca)


async def _an_issuer_refused_then_one_applied(tmp_path: Path, base: str, ca: Path) -> None:
    own = tmp_path / "own.token"
    own.write_text(hs256_token(b"k" * 32, "sluice"))
    cfg = write(tmp_path / "sluice.toml", auth_oidc_issuers=f"{base}/good")
    line = argv(cfg, "--auth-mode", "proxy", "--auth-oidc-ca", str(ca),
                "--auth-oidc-audiences", "pulsar", "--broker-auth-token-file", str(own),
                "--no-check-broker")  # fmt: skip
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        write(cfg, auth_oidc_issuers=f"{base}/gone")
        refused = await proxy.reload_from_source("file")
        assert refused.outcome == "refused", refused.to_json()
        (error,) = refused.errors
        assert f"OpenID Connect issuer {base}/gone: keys could not be fetched" in error
        assert "HTTP 404" in error
        assert proxy.config.auth_oidc_issuers == (f"{base}/good",)
        write(cfg, auth_oidc_issuers=f"{base}/also")
        applied = await proxy.reload_from_source("file")
        assert applied.outcome == "applied", applied.to_json()
        nursery.cancel_scope.cancel()


async def test_a_broker_ca_rewritten_under_its_name_is_put_in_force(tmp_path: Path) -> None:
    """The broker CA (or Sluice's client certificate) rotated in place is
    a change: a reload makes Sluice's TLS toward brokers anew from the
    files, for the connections it opens from then on, rather than
    answering "unchanged" while dials go on failing against the new broker
    certificate."""
    from tests.helpers.support import tls_files

    ca, _, _ = tls_files(tmp_path, "localhost")
    line = argv(write(tmp_path / "sluice.toml"), "--broker-tls-ca", str(ca))
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    assert (await proxy.reload_from_source("SIGHUP")).outcome == "unchanged"
    before = proxy.backend.tls_context(True)
    assert before is not None
    tls_files(tmp_path, "localhost")  # a new CA, written under the same name
    rotated = await proxy.reload_from_source("SIGHUP")
    assert rotated.outcome == "applied", rotated.to_json()
    assert rotated.changed == ["--broker-tls"] and not rotated.kept, rotated.to_json()
    after = proxy.backend.tls_context(True)
    assert after is not None and after.get_ca_certs() != before.get_ca_certs()

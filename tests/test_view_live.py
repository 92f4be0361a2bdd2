"""``sluice view --live``: the page open in real Chromium while traffic runs
through ``sluice proxy`` in front of Apache Pulsar (frames arriving without
a reload, pause and resume, save); the proxy's ``POST /live`` (its token,
its cursor, its bound); one view over ``--workers``; and the compiled relay
path handing reads to the tap and back with no message lost."""

from __future__ import annotations

import base64
import collections
import http.client
import io
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pulsar
import pytest
from playwright.sync_api import Browser

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.protocols.core import Closed, Conn, Opened, Taps
from sluice.proxy import live as live_module
from sluice.proxy.live import LiveTap
from sluice.recording.format import PayloadPolicy, header, read_records, recording_files
from sluice.view.index import Filter, Index, LetGo
from sluice.view.live import LiveIndex
from sluice.view.server import serve
from tests.helpers.poll import wait_until
from tests.helpers.support import (
    QUIET,
    SLUICE,
    ProxyProcess,
    client,
    one_client_per_worker,
    start_proxy,
    worker_pids,
)
from tests.test_view import browser, console_errors  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e  # every test here starts a process

TOKEN = "live-view-token"


@dataclass
class Watched:
    proxy: ProxyProcess
    admin: int
    view: subprocess.Popen[str]
    url: str

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + "api/" + path, timeout=10) as answer:
            return json.loads(answer.read())

    def frames(self) -> int:
        return int(self.api("status")["frames"])


def watched(broker_url: str, tmp_path: Path, *extra: str) -> Watched:
    """A proxy with an admin token, and ``sluice view --live`` on it."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    admin, port = free_port(), free_port()
    proxy = start_proxy(broker_url, tmp_path, "--admin", f"127.0.0.1:{admin}",
                        "--admin-token-file", str(tmp_path / "token"), *extra)  # fmt: skip
    try:
        view = subprocess.Popen(
            [*SLUICE, "view", "--live", f"127.0.0.1:{admin}", "--admin-token-file",
             str(tmp_path / "token"), "--listen", f"127.0.0.1:{port}", "--save-dir", str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_for_port("127.0.0.1", port, 20, view)  # type: ignore[arg-type]
        except BaseException:  # no test holds them yet to stop them
            view.kill()
            view.wait(10)
            raise
    except BaseException:
        proxy.kill()
        raise
    return Watched(proxy, admin, view, f"http://127.0.0.1:{port}/")


def stop(w: Watched) -> None:
    w.view.kill()
    w.view.wait(10)
    w.proxy.kill()
    assert "Traceback" not in w.proxy.log(), w.proxy.log()


class Producing:
    """A producer sending one message every ``every`` seconds in a thread
    until stopped; what it sent (each acknowledged)."""

    def __init__(self, url: str, topic: str, every: float = 0.05) -> None:
        self.sent: list[bytes] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._client = pulsar.Client(url, operation_timeout_seconds=30, logger=QUIET)
        self._producer = self._client.create_producer(topic, batching_enabled=False)
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        n = 0
        while not self._stop.is_set():
            body = f"live-{n}".encode()
            try:
                self._producer.send(body)
                self.sent.append(body)
            except Exception as exc:  # asserted by the test
                self.failures.append(exc)
            n += 1
            time.sleep(every)

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(30)
        self._client.close()
        return self.sent


@pytest.fixture
def live_on_apache(apache_pulsar: ApachePulsar, tmp_path: Path) -> Iterator[Watched]:
    w = watched(apache_pulsar.url, tmp_path)
    yield w
    stop(w)


def test_the_live_page_shows_frames_as_they_come_pauses_and_saves(
    live_on_apache: Watched,
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    w = live_on_apache
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = console_errors(page)
    page.goto(w.url)
    page.wait_for_function(
        "() => document.querySelector('header h1').textContent === 'Sluice live'"
    )
    page.evaluate("window.sameDocument = true")  # gone if the page reloads
    topic = f"persistent://public/default/live-{time.monotonic_ns()}"
    producing = Producing(f"pulsar://127.0.0.1:{w.proxy.port}", topic)
    try:
        # SENDs arrive in the table without a reload, the newest page shown.
        page.wait_for_function(
            "() => "
            "[...document.querySelectorAll('#frames tbody td:nth-child(5)')]"
            ".filter((c) => c.textContent === 'SEND').length >= 10",
            timeout=30_000,
        )
        assert page.evaluate("window.sameDocument") is True
        page.wait_for_selector("#sequence .arrow")
        # Paused: the table stands still while frames keep coming.
        page.click("#pause")
        shown = page.inner_text("#count")
        held = w.frames()
        wait_until(lambda: w.frames() >= held + 20, 20, "frames while paused", step=0.05)
        time.sleep(1.5)  # more than the page's one-second round
        assert page.inner_text("#count") == shown
        page.click("#pause")  # resume
        page.wait_for_function(f"() => document.getElementById('count').textContent !== {shown!r}")
        # Save: a capture directory every reader takes, holding the sends.
        page.click("#save")
        page.wait_for_function("() => " "document.getElementById('live-note').textContent"
                               ".startsWith('saved: ')")  # fmt: skip
        saved = Path(page.inner_text("#live-note").removeprefix("saved: "))
        assert saved.parent == tmp_path and saved.name.startswith("snapshot-")
    finally:
        sent = producing.stop()
    assert producing.failures == []
    frames = [r for p in recording_files(saved) for r in read_records(p) if r["k"] == "frame"]
    sends = [f for f in frames if f["s"]["cmd"] == "SEND"]
    assert len(sends) >= 10 and {f["s"]["topic"] for f in sends} == {topic}
    assert len(sent) >= len(sends)
    page.screenshot(path=str(tmp_path / "live.png"))
    assert errors == []


def ask(admin: int, after: str | None, token: str | None = TOKEN) -> dict[str, Any]:
    body = json.dumps({} if after is None else {"after": after}).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{admin}/live", data=body,
                                     headers=headers, method="POST")  # fmt: skip
    with urllib.request.urlopen(request, timeout=15) as answer:
        data: dict[str, Any] = json.loads(answer.read())
    data["unpacked"] = list(msgpack.Unpacker(io.BytesIO(base64.b64decode(data["records"])),
                                             raw=False, strict_map_key=False))  # fmt: skip
    return data


def frames_after(admin: int, cursor: str) -> list[dict[str, Any]]:
    return [r for r in ask(admin, cursor)["unpacked"] if r["k"] == "frame"]


def test_watching_starts_and_stops_mid_stream_and_no_message_is_lost(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Producers and a consumer at a steady rate while a watcher comes and
    goes three times: every relayed connection hands its reads from the
    compiled step to the tap and back; every message arrives once, in order."""
    (tmp_path / "token").write_text(TOKEN)
    admin = free_port()
    idle_after = 1.0
    proxy = start_proxy(broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}",
                        "--admin-token-file", str(tmp_path / "token"),
                        env={"SLUICE_LIVE_IDLE_AFTER": str(idle_after)})  # fmt: skip
    topic = f"persistent://public/default/handover-{time.monotonic_ns()}"
    try:
        with client(proxy.url) as c:
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producing = Producing(proxy.url, topic, every=0.005)
            try:
                for _ in range(3):
                    first = ask(admin, None)
                    assert first["unpacked"][0]["k"] == "header"
                    seen = wait_until(
                        partial(frames_after, admin, first["next"]), 20, "frames", step=0.05
                    )
                    assert seen
                    time.sleep(idle_after + 0.5)  # nobody asks: idle again at the next read
            finally:
                sent = producing.stop()
            got: list[bytes] = []
            while len(got) < len(sent):
                message = consumer.receive(timeout_millis=15_000)
                got.append(message.data())
                consumer.acknowledge(message)
        assert producing.failures == []
        assert got == sent  # each once, in order
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()


def test_live_needs_the_token_and_a_cursor_it_gave(broker: EmbeddedBroker, tmp_path: Path) -> None:
    admin = free_port()
    open_proxy = start_proxy(broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}")
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            ask(admin, None, token=None)
        assert refused.value.code == 403
        assert "needs an admin token" in refused.value.read().decode()
    finally:
        open_proxy.kill()
    (tmp_path / "token").write_text(TOKEN)
    admin = free_port()
    proxy = start_proxy(broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}",
                        "--admin-token-file", str(tmp_path / "token"))  # fmt: skip
    try:
        for token, code in (("wrong", 401), (None, 401)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                ask(admin, None, token=token)
            assert refused.value.code == code
        with pytest.raises(urllib.error.HTTPError) as refused:
            ask(admin, "not-a-cursor")
        assert refused.value.code == 400
        assert ask(admin, None)["unpacked"][0]["k"] == "header"
    finally:
        proxy.kill()


def test_one_live_view_over_workers(broker: EmbeddedBroker, tmp_path: Path) -> None:
    w = watched(broker.url, tmp_path, "--workers", "2")
    clients: list[pulsar.Client] = []
    try:
        pids = worker_pids(w.proxy, 2)
        topic = f"persistent://public/default/workers-live-{time.monotonic_ns()}"

        def connect() -> None:
            c = pulsar.Client(w.proxy.url, operation_timeout_seconds=15, logger=QUIET)
            clients.append(c)
            c.create_producer(topic, batching_enabled=False).send(b"before")

        one_client_per_worker(pids, connect)
        producers = [c.create_producer(topic, batching_enabled=False) for c in clients]

        def both_workers_seen() -> bool:
            for producer in producers:  # until the view is watching, some go unseen
                producer.send(b"watched")
            sends = w.api("frames?cmd=SEND&limit=1000")["rows"]
            names = {c["id"]: c["name"] for c in w.api("connections")}
            # Worker i numbers its connections i+1, i+1+2, …: odd on worker 0.
            return {int(names[r["conn"]][1:]) % 2 for r in sends} == {0, 1}

        wait_until(both_workers_seen, 20, "SENDs through both workers", step=0.05)
    finally:
        for c in clients:
            c.close()
        stop(w)


def test_the_tap_costs_nothing_idle_and_keeps_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a broker: idle, the tap is passed over by the compiled path
    and takes no frames; watched, it is not; past its bound it drops the
    oldest records and says how many; unwatched for its time, idle again."""
    now = [0.0]
    counts = SimpleNamespace(figures="compiled counts", frames=None, event=lambda *_: None)
    taps = Taps([counts])
    tap = LiveTap(taps, "pulsar", PayloadPolicy.HASH, listen=[], broker="pulsar://b:6650",
                  clock=lambda: now[0])  # fmt: skip
    taps.add(tap)
    conn = Conn(1, "10.0.0.1:5000", "plain", "pulsar")
    conn.kind = "proxied"
    taps.event(conn, Opened())
    assert tap.idle and taps.quick(conn) == ("compiled counts", None)  # passed over
    generation = taps.generation
    first = tap.take(None)
    assert not tap.idle and taps.generation == generation + 1
    # Watched: the compiled step puts its records in the tap (where built),
    # and with a second taker of records (a recorder) reads come through Python.
    quick = taps.quick(conn)
    if tap.quick_records(conn) is not None:
        assert quick == ("compiled counts", (tap.carried, tap.quick_records(conn)[1]))
    else:
        assert quick is None
    taps.add(SimpleNamespace(quick_records=lambda conn: (print, 0)))
    assert taps.quick(conn) is None
    generation = taps.generation - 1
    kinds = [msgpack.unpackb(r, raw=False, strict_map_key=False)["k"] for r in first.records]
    assert kinds == ["header", "conn"]  # the connection open before watching
    monkeypatch.setattr(live_module, "MAX_RECORDS", 5)
    for _ in range(12):
        tap.event(conn, Opened())  # a record each
    later = tap.take(first.next)
    assert later.dropped == 12 + 1 - 5 - 1 and len(later.records) == 1 + 5  # (the header first)
    now[0] += live_module.WATCH_SECONDS + 1
    tap.frames(conn, True, [])  # no frames: nothing to do, still watched
    tap.frames(conn, True, [object()])  # a read: the watcher is gone
    assert tap.idle and taps.generation == generation + 2


def test_the_view_answers_only_its_own_page(tmp_path: Path) -> None:
    """Another site's page can neither save (a POST from its origin, or
    without the header the page's own script sends) nor read frames by
    DNS rebinding (a Host that is a name other than the view's)."""
    index = LiveIndex("127.0.0.1:9")
    index.feed([
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
               sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:1", "broker": "b",
         "kind": "proxied", "listener": ""},
        {"k": "frame", "c": 1, "d": 0, "t": 5, "w": 0, "n": 6, "raw": b"secret",
         "s": {"cmd": "SEND", "topic": "t"}},
    ])  # fmt: skip
    server = serve(index, "127.0.0.1", 0, build=False, save_dir=tmp_path)
    port = int(server.server_address[1])

    def call(method: str, path: str, **headers: str) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request(method, path, headers=headers)
            answer = connection.getresponse()
            return answer.status, json.loads(answer.read())
        finally:
            connection.close()

    own = f"127.0.0.1:{port}"
    try:
        for host in (f"rebound.evil.example:{port}", f"evil.example:{port}", "127.0.0.1:1"):
            status, said = call("GET", "/api/frame/0", Host=host)
            assert status == 403 and "raw_hex" not in said, (host, said)
        for host in (own, f"localhost:{port}", f"[::1]:{port}"):
            assert call("GET", "/api/frame/0", Host=host)[0] == 200, host
        refused = (
            {"Host": own, "Origin": "http://evil.example", "X-Sluice": "save"},
            {"Host": own, "Origin": f"http://{own}"},  # not from the page's script
            {"Host": own, "Content-Type": "text/plain"},  # a form, say
            {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}",
             "X-Sluice": "save"},
        )  # fmt: skip
        for headers in refused:
            status, said = call("POST", "/api/save", **headers)
            assert status == 403 and "error" in said, (headers, said)
        assert list(tmp_path.iterdir()) == []
        status, said = call(
            "POST", "/api/save", Host=own, Origin=f"http://{own}", **{"X-Sluice": "save"}
        )
        assert status == 201 and Path(said["path"]).parent == tmp_path, said
    finally:
        server.shutdown()
        server.server_close()


def test_save_before_the_proxy_answered_is_refused(tmp_path: Path) -> None:
    """Nothing received yet (the proxy unreachable, say): save writes no
    capture that no reader takes, and says why."""
    index = LiveIndex("127.0.0.1:9")
    server = serve(index, "127.0.0.1", 0, build=False, save_dir=tmp_path)
    own = f"127.0.0.1:{server.server_address[1]}"
    try:
        connection = http.client.HTTPConnection("127.0.0.1", int(server.server_address[1]))
        connection.request("POST", "/api/save", headers={"Origin": f"http://{own}",
                                                         "X-Sluice": "save"})  # fmt: skip
        answer = connection.getresponse()
        said = json.loads(answer.read())
        connection.close()
    finally:
        server.shutdown()
        server.server_close()
    assert answer.status == 409 and said == {"error": "nothing received from the proxy yet"}
    assert list(tmp_path.iterdir()) == []


def test_a_watcher_who_comes_later_is_told_of_the_open_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second watcher (or the first restarted) while the tap is already
    watched: every open connection's ``conn`` record comes first, also once
    it has left the ring, and none twice."""
    counts = SimpleNamespace(figures=None, frames=None, event=lambda *_: None)
    taps = Taps([counts])
    tap = LiveTap(taps, "pulsar", PayloadPolicy.HASH, listen=[], broker="pulsar://b:6650")
    taps.add(tap)
    monkeypatch.setattr(live_module, "MAX_RECORDS", 5)

    def kinds(taken: live_module.Taken) -> list[tuple[str, int]]:
        unpacked = [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in taken.records]
        return [(r["k"], r.get("c", 0)) for r in unpacked]

    tap.take(None)  # the first watcher
    long_lived = Conn(7, "10.9.8.7:5555", "plain", "pulsar")
    long_lived.kind, long_lived.broker = "proxied", "pulsar://broker-3:6650"
    taps.event(long_lived, Opened())
    # A second watcher while its record is in the ring: told of it once.
    assert kinds(tap.take(None)) == [("header", 0), ("conn", 7)]
    for n in range(100, 110):  # short connections push it out of the ring
        short = Conn(n, "10.0.0.1:1", "plain", "pulsar")
        taps.event(short, Opened())
        taps.event(short, Closed("done"))
    later = kinds(tap.take(None))
    assert later[:2] == [("header", 0), ("conn", 7)], later
    assert later.count(("conn", 7)) == 1 and len(later) == 2 + 5, later


def test_a_watcher_who_comes_later_sees_no_frame_before_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``conn`` record a later watcher is told of an open connection
    with (its own gone from the ring) is stamped no later than the ring's
    oldest record: the view counts its times from the first record, and no
    frame, connection or rate comes out negative."""
    monkeypatch.setattr(live_module, "MAX_RECORDS", 5)
    taps = Taps([SimpleNamespace(figures=None, frames=None, event=lambda *_: None)])
    tap = LiveTap(taps, "pulsar", PayloadPolicy.HASH, listen=[], broker="pulsar://b:6650")
    taps.add(tap)
    tap.take(None)  # a first watcher
    conn = Conn(7, "10.9.8.7:5555", "plain", "pulsar")
    conn.kind, conn.broker = "proxied", "pulsar://b:6650"
    taps.event(conn, Opened())
    start = time.monotonic_ns() - 10 * 10**9  # sent in the last ten seconds
    for n in range(6):  # its conn record leaves the ring
        tap._add({"k": "frame", "c": 7, "d": 0, "t": start + n * 10**9, "w": time.time_ns(),
                  "n": 10, "raw": b"", "p": [10],
                  "s": {"cmd": "SEND", "topic": "t", "seq": n}})  # fmt: skip
    taken = tap.take(None)  # a second watcher, later
    records = [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in taken.records]
    assert [r["k"] for r in records] == ["header", "conn"] + ["frame"] * 5
    assert records[1]["t"] <= records[2]["t"], records[:3]
    index = LiveIndex("127.0.0.1:9")
    index.feed(records)
    times = [r["t"] for r in index.page(Filter(), 0, 10)["rows"]]
    assert times == [0.0, 1.0, 2.0, 3.0, 4.0], times
    shown = index.connections_json()[0]
    assert shown["start"] == 0.0 and shown["duration"] == 4.0, shown
    assert index.summary()["seconds"] == 4.0


def live_frame(n: int, c: int = 1) -> dict[str, Any]:
    """Frame ``n`` of a live stream: at ``n`` µs, ``n`` bytes, on topic ``t<n>``
    (a row or a detail mixing two frames' columns shows)."""
    return {"k": "frame", "c": c, "d": 0, "t": n * 1000, "w": 0, "n": n, "raw": b"", "p": [n],
            "s": {"cmd": "SEND", "topic": f"t{n}", "pid": 0, "seq": n}}  # fmt: skip


def live_index(max_frames: int) -> LiveIndex:
    index = LiveIndex("127.0.0.1:9", max_frames=max_frames)
    index.feed([
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.HASH,
               sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:1", "broker": "b",
         "kind": "proxied", "listener": ""},
    ])  # fmt: skip
    return index


def test_a_live_frame_keeps_its_id_once_older_ones_are_let_go() -> None:
    """``/api/frame/N`` names the same frame for as long as the view holds
    it, however many older ones it lets go; one let go is a 410 that says
    so, one not come yet a 404."""
    index = live_index(max_frames=10)
    index.feed([live_frame(n) for n in range(1, 9)])
    ids = {r["topic"]: r["i"] for r in index.page(Filter(), 0, 100)["rows"]}
    index.feed([live_frame(n) for n in range(9, 15)])  # 14 > 10: the oldest 9 go
    assert index.let_go == 9
    rows = index.page(Filter(), 0, 100)["rows"]
    assert [r["topic"] for r in rows] == [f"t{n}" for n in range(10, 15)]
    assert [r["i"] for r in rows] == list(range(9, 14))  # ids as before: t10 was frame 9
    server = serve(index, "127.0.0.1", 0, build=False)
    base = f"http://127.0.0.1:{server.server_address[1]}/api/"
    try:
        for row in rows:
            with urllib.request.urlopen(f"{base}frame/{row['i']}", timeout=10) as answer:
                detail = json.loads(answer.read())
            held = (row["i"], row["topic"], row["size"])
            assert (detail["i"], detail["topic"], detail["payload"]["size"]) == held
        for gone, code, said in (
            (ids["t8"], 410, f"frame {ids['t8']} was let go: this view holds frames 9 to 13"),
            (14, 404, "no such frame"),
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}frame/{gone}", timeout=10)
            assert refused.value.code == code
            assert json.loads(refused.value.read()) == {"error": said}
    finally:
        server.shutdown()
        server.server_close()


def test_the_live_views_questions_while_frames_come_and_go() -> None:
    """The page's questions (the HTTP server's threads) while the watch
    thread feeds frames and lets the oldest go: every answer is whole (no
    error, no row or detail mixing two frames), many times over."""
    index = live_index(max_frames=2000)
    batches, per_batch = 120, 300
    problems: collections.Counter[str] = collections.Counter()
    done = threading.Event()

    def feeder() -> None:
        try:
            for b in range(batches):
                index.feed([live_frame(b * per_batch + k) for k in range(1, per_batch + 1)])
        finally:
            done.set()

    def whole(row: dict[str, Any]) -> None:
        if not (row["size"] == round(row["t"] * 1e6) and row["topic"] == f"t{row['size']}"):
            problems[f"mixed: {row}"] += 1

    def reader(what: str) -> None:
        while not done.is_set():
            try:
                if what == "page":
                    page = index.page(Filter(), max(0, index.frames - 200), 200)
                    for row in page["rows"]:
                        whole(row)
                elif what == "sequence":
                    for arrow in index.sequence(Filter(cmd="SEND"), 0)["arrows"]:
                        whole(arrow)
                elif what == "timeline":
                    index.timeline(Filter())
                    index.summary()
                else:
                    newest = index.page(Filter(), max(0, index.frames - 1), 1)["rows"]
                    if newest:
                        try:
                            detail = index.detail(newest[0]["i"])
                        except LetGo:  # let go between the two questions: a 410, rightly
                            assert newest[0]["i"] < index.let_go
                            continue
                        whole(detail)
                        if detail["payload"]["size"] != detail["size"]:
                            problems[f"another frame's record: {detail['topic']}"] += 1
            except Exception as exc:  # each a "500 internal error" on the page
                problems[f"{what}: {exc!r}"] += 1

    threads = [threading.Thread(target=feeder)] + [
        threading.Thread(target=reader, args=(what,))
        for what in ("page", "sequence", "timeline", "detail")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert done.is_set() and index.let_go > 30_000
    assert not problems, problems.most_common(5)


def test_a_live_view_of_many_short_connections_holds_a_bounded_window() -> None:
    """Hours of short connections (each a frame, a fault rule's note and a
    close): the view holds the connections, notes and records of the frames
    it holds, not every one since it started; the page is given the newest
    notes; a frame's connection is found by its id, also once older
    connections have gone."""
    index = live_index(max_frames=100)
    t = 1
    for hour in range(3):
        batch: list[dict[str, Any]] = []
        for k in range(1000):
            c = 2 + hour * 1000 + k
            t += 1_000_000
            batch += [
                {"k": "conn", "c": c, "t": t, "w": 0, "client": f"10.1.0.1:{c}",
                 "broker": "b", "kind": "proxied", "listener": "plain"},
                {"k": "frame", "c": c, "d": 0, "t": t + 1, "w": 0, "n": 20, "raw": b"",
                 "p": [20], "s": {"cmd": "CONNECT", "topic": f"t{c}"}},
                {"k": "fault", "c": c, "d": 0, "t": t + 2, "w": 0, "rule": "r1",
                 "action": "delay", "cmd": "CONNECT"},
                {"k": "close", "c": c, "t": t + 3, "w": 0, "reason": "client closed"},
            ]  # fmt: skip
        index.feed(batch)
    assert index.frames <= 100 and index.let_go >= 2900
    assert len(index.connections) <= 101  # (the one still open, c1, included)
    assert len(index.notes) <= 100 and len(index._opened) <= 100
    assert len(index._reading.by_key) <= 101 and len(index._records) <= 400
    server = serve(index, "127.0.0.1", 0, build=False)
    base = f"http://127.0.0.1:{server.server_address[1]}/api/"

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=10) as answer:
            return json.loads(answer.read())

    try:
        status, timeline = get("status"), get("timeline")
        rows = get("frames?limit=1000")["rows"]
        names = {c["id"]: c["name"] for c in get("connections")}
    finally:
        server.shutdown()
        server.server_close()
    first = rows[0]["t"]
    for notes in (status["notes"], timeline["notes"]):
        assert notes and all(n["t"] >= first for n in notes)
        assert notes[-1]["t"] == index.notes[-1].t > rows[-1]["t"]  # the newest
    assert len(rows) == index.frames
    assert all(names[r["conn"]] == "c" + r["topic"][1:] for r in rows), rows[:3]
    assert "c1" in names.values()  # open: kept, though it has no frame


def test_a_live_view_goes_on_after_the_proxy_restarts() -> None:
    """The proxy restarts under a watching view (same admin address): the
    view's cursor is the last process's, above anything the new one has
    numbered. It is answered as a new watcher (the header, the open
    connections), and the view reads the new process's connections as new
    ones, not as the old ones with the same ids. An ask with a cursor while
    the tap is idle is a new watcher's too."""
    now = [0.0]

    def proxy() -> tuple[Taps, LiveTap]:
        taps = Taps([SimpleNamespace(figures=None, frames=None, event=lambda *_: None)])
        tap = LiveTap(taps, "pulsar", PayloadPolicy.HASH, listen=[], broker="pulsar://b:6650",
                      clock=lambda: now[0])  # fmt: skip
        taps.add(tap)
        return taps, tap

    def unpacked(taken: live_module.Taken) -> list[dict[str, Any]]:
        return [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in taken.records]

    def opened(taps: Taps, n: int, client: str) -> Conn:
        conn = Conn(n, client, "plain", "pulsar")
        conn.kind = "proxied"
        taps.event(conn, Opened())
        return conn

    index = LiveIndex("127.0.0.1:9")
    taps, tap = proxy()
    taken = tap.take(None)
    index.feed(unpacked(taken))
    for n in range(1, 301):
        taps.event(opened(taps, n, f"10.0.0.1:{5000 + n}"), Closed("client closed"))
    taken = tap.take(taken.next)
    index.feed(unpacked(taken), 0, str(taken.next))
    cursor = taken.next
    assert cursor - (tap.process << live_module.PROCESS_SHIFT) == 600
    assert len(index.connections) == 300
    taps, tap = proxy()  # restarted
    opened(taps, 1, "192.168.9.9:4444")
    taken = tap.take(cursor)
    assert [r["k"] for r in unpacked(taken)] == ["header", "conn"]
    index.feed(unpacked(taken), taken.dropped, str(taken.next))
    tap._add({"k": "frame", "c": 1, "d": 0, "t": time.monotonic_ns(), "w": time.time_ns(),
              "n": 10, "raw": b"", "p": [10], "s": {"cmd": "SEND", "topic": "t"}})  # fmt: skip
    taken = tap.take(taken.next)
    index.feed(unpacked(taken), taken.dropped, str(taken.next))
    row = index.page(Filter(), 0, 10)["rows"][-1]
    connection = index.by_id[row["conn"]]
    assert (connection.client, connection.closed) == ("192.168.9.9:4444", "")
    old = [c for c in index.connections if c.conn == 1 and c is not connection]
    assert [(c.client, c.closed) for c in old] == [("10.0.0.1:5001", "client closed")]
    assert index.status()["restarts"] == 1
    # Idle (nobody asked for its time): a cursor it gave is a new watcher's.
    now[0] += live_module.WATCH_SECONDS + 1
    tap.frames(Conn(1, "", "plain", "pulsar"), True, [object()])  # a read: idle now
    assert tap.idle
    taken = tap.take(taken.next)
    again = unpacked(taken)
    assert [r["k"] for r in again] == ["header", "conn"] and again[1]["c"] == 1
    index.feed(again, 0, str(taken.next))
    assert index.restarts == 1  # the same process: no restart


def restartable_proxy() -> tuple[Taps, LiveTap]:
    """A proxy process's taps and live tap (a new one: a restarted proxy)."""
    taps = Taps([SimpleNamespace(figures=None, frames=None, event=lambda *_: None)])
    tap = LiveTap(taps, "pulsar", PayloadPolicy.HASH, listen=[], broker="pulsar://b:6650")
    taps.add(tap)
    return taps, tap


def open_conn(taps: Taps, n: int, client: str) -> Conn:
    conn = Conn(n, client, "plain", "pulsar")
    conn.kind, conn.broker = "proxied", "pulsar://b:6650"
    taps.event(conn, Opened())
    return conn


def send_on(tap: LiveTap, c: int, topic: str) -> None:
    tap._add({"k": "frame", "c": c, "d": 0, "t": time.monotonic_ns(), "w": time.time_ns(),
              "n": 10, "raw": b"", "p": [10], "s": {"cmd": "SEND", "topic": topic}})  # fmt: skip


def supervisor_ask(index: LiveIndex, workers: dict[int, LiveTap], cursor: str) -> str:
    """What a supervisor's ``/live`` does (``sluice/proxy/workers.py``): each
    worker that answers asked after its own number, their records together,
    the cursor ``INDEX:N,…`` (a worker not answering keeps its number)."""
    after = live_module.parse_after(json.dumps({"after": cursor}).encode())
    records: list[bytes] = []
    cursors = dict(after)
    dropped = 0
    for i, tap in workers.items():
        taken = tap.take(after.get(i))
        records += taken.records
        cursors[i] = taken.next
        dropped += taken.dropped  # (summed: the answer has one count)
    unpacked = [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in records]
    cursor = ",".join(f"{i}:{n}" for i, n in sorted(cursors.items()))
    index.feed(unpacked, dropped, cursor)
    return cursor


def watched_before_a_restart() -> tuple[LiveIndex, live_module.Taken]:
    """A view of a proxy with connection 1 (10.0.0.1:5001) and a SEND on
    "old-topic": the view, and the proxy's last answer (its cursor)."""
    index = LiveIndex("127.0.0.1:9")
    taps, tap = restartable_proxy()
    taken = tap.take(None)
    index.feed(unpack(taken), 0, str(taken.next))
    open_conn(taps, 1, "10.0.0.1:5001")
    send_on(tap, 1, "old-topic")
    taken = tap.take(taken.next)
    index.feed(unpack(taken), 0, str(taken.next))
    return index, taken


def test_a_restarted_proxy_is_told_from_its_cursor_though_others_watch_it() -> None:
    """The proxy restarts under the view, and someone else watches the new
    process already (its numbers have passed the view's cursor): the
    cursor names the last process, so the new one answers it as a new
    watcher's; the view closes the last process's connections only."""
    index, taken = watched_before_a_restart()
    cursor = taken.next
    taps, tap = restartable_proxy()  # restarted ...
    tap.take(None)  # ... and watched by someone else
    open_conn(taps, 1, "192.168.9.9:4444")
    for _ in range(3):
        send_on(tap, 1, "new-topic")
    taken = tap.take(cursor)
    assert [r["k"] for r in unpack(taken)] == ["header", "conn", "frame", "frame", "frame"]
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    assert index.restarts == 1
    rows = [(index.by_id[r["conn"]].client, index.by_id[r["conn"]].closed, r["topic"])
            for r in index.page(Filter(), 0, 10)["rows"]]  # fmt: skip
    assert (
        rows
        == [("10.0.0.1:5001", "the proxy restarted", "old-topic")]
        + [("192.168.9.9:4444", "", "new-topic")] * 3
    ), rows


def test_workers_coming_late_or_replaced_under_the_view() -> None:
    """``--workers 2``: a worker the supervisor's first answer left out is
    a new process, not a restart (nothing closed); a worker the supervisor
    replaced (numbering its connections as the last one did) closes the
    last one's connections only, and its own are new ones."""
    index = LiveIndex("127.0.0.1:9")
    (taps0, tap0), (taps1, tap1) = restartable_proxy(), restartable_proxy()
    open_conn(taps0, 1, "10.0.0.1:5001")
    open_conn(taps1, 2, "10.0.0.2:6002")
    cursor = supervisor_ask(index, {0: tap0}, "")  # worker 1 slow to answer
    send_on(tap0, 1, "zero")
    cursor = supervisor_ask(index, {0: tap0, 1: tap1}, cursor)
    send_on(tap1, 2, "one")
    cursor = supervisor_ask(index, {0: tap0, 1: tap1}, cursor)
    assert index.restarts == 0
    assert [(c.conn, c.client, c.closed) for c in index.connections] == [
        (1, "10.0.0.1:5001", ""), (2, "10.0.0.2:6002", "")]  # fmt: skip
    taps1, tap1 = restartable_proxy()  # worker 1 replaced (killed: no close told)
    open_conn(taps1, 2, "172.16.0.9:7777")
    send_on(tap0, 1, "zero")
    cursor = supervisor_ask(index, {0: tap0, 1: tap1}, cursor)
    send_on(tap1, 2, "replaced")
    supervisor_ask(index, {0: tap0, 1: tap1}, cursor)
    assert index.restarts == 1
    assert [(c.conn, c.client, c.closed) for c in index.connections] == [
        (1, "10.0.0.1:5001", ""), (2, "10.0.0.2:6002", "worker 1 was replaced"),
        (2, "172.16.0.9:7777", "")]  # fmt: skip
    rows = [
        (index.by_id[r["conn"]].client, r["topic"]) for r in index.page(Filter(), 0, 10)["rows"]
    ]
    assert rows == [("10.0.0.1:5001", "zero"), ("10.0.0.2:6002", "one"),
                    ("10.0.0.1:5001", "zero"), ("172.16.0.9:7777", "replaced")], rows  # fmt: skip


def unpack(taken: live_module.Taken) -> list[dict[str, Any]]:
    return [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in taken.records]


def test_save_after_a_restart_keeps_each_process_its_own(tmp_path: Path) -> None:
    """Saved after the proxy restarted under the view: each process's
    records in a file of their own, with its own header, so the capture
    holds two connections 1 with their own frames, not one with both."""
    index, taken = watched_before_a_restart()
    taps, tap = restartable_proxy()  # restarted
    open_conn(taps, 1, "192.168.9.9:4444")
    taken = tap.take(taken.next)
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    send_on(tap, 1, "new-topic")
    taken = tap.take(taken.next)
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    saved = Index(index.save(tmp_path))
    saved.build()
    assert saved.error == "" and len(recording_files(saved.target)) == 2
    assert sorted((c.conn, c.client) for c in saved.connections) == [
        (1, "10.0.0.1:5001"), (1, "192.168.9.9:4444")]  # fmt: skip
    rows = [
        (saved.by_id[r["conn"]].client, r["topic"]) for r in saved.page(Filter(), 0, 10)["rows"]
    ]
    assert rows == [("10.0.0.1:5001", "old-topic"), ("192.168.9.9:4444", "new-topic")], rows


def test_connections_closed_while_nobody_watched_are_closed_in_the_view(tmp_path: Path) -> None:
    """The view stops asking for longer than the proxy keeps watching (so
    the tap goes idle and keeps nothing), and a connection closes
    meanwhile: when the view asks again it is told which are open, and
    closes the other one, on the page and in a save; the one still open
    stays open, and one closed in the answer itself is closed once."""
    now = [0.0]
    taps = Taps([SimpleNamespace(figures=None, frames=None, event=lambda *_: None)])
    tap = LiveTap(taps, "pulsar", PayloadPolicy.HASH, listen=[], broker="pulsar://b:6650",
                  clock=lambda: now[0])  # fmt: skip
    taps.add(tap)
    index = LiveIndex("127.0.0.1:9")
    taken = tap.take(None)
    index.feed(unpack(taken), 0, str(taken.next))
    gone, stays, later = (open_conn(taps, n, f"10.0.0.{n}:500{n}") for n in (1, 2, 3))
    send_on(tap, 1, "t")
    taken = tap.take(taken.next)
    index.feed(unpack(taken), 0, str(taken.next))
    now[0] += live_module.WATCH_SECONDS + 1
    tap.frames(stays, True, [object()])  # a read after the watch ran out: idle now
    assert tap.idle
    taps.event(gone, Closed("client closed"))  # while nobody watches
    taken = tap.take(taken.next)  # the view asks again: a new watcher's answer
    taps.event(later, Closed("broker closed"))  # after it: the next answer says so
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    taken = tap.take(taken.next)
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    shown = [(c.conn, c.closed) for c in index.connections]
    assert shown == [(1, "closed while this view was not told"), (2, ""),
                     (3, "broker closed")], shown  # fmt: skip
    saved = index.save(tmp_path)
    closes = [(r["c"], r["reason"]) for path in recording_files(saved)
              for r in read_records(path) if r["k"] == "close"]  # fmt: skip
    assert closes == [(1, "closed while this view was not told"), (3, "broker closed")], closes


def test_a_save_after_a_restart_closes_the_last_process_connections(tmp_path: Path) -> None:
    """The connections a restart ended (the view closed them when the new
    process answered) end in a save too: a ``close`` record in the last
    process's file, so that inspect and replay do not see them open."""
    index, taken = watched_before_a_restart()
    taps, tap = restartable_proxy()  # restarted
    open_conn(taps, 1, "192.168.9.9:4444")
    taken = tap.take(taken.next)
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    saved = index.save(tmp_path)
    ended = {}
    for path in recording_files(saved):
        records = list(read_records(path))
        clients = {r["c"]: r["client"] for r in records if r["k"] == "conn"}
        for r in records:
            if r["k"] == "close":
                ended[clients[r["c"]]] = r["reason"]
        times = [r["t"] for r in records if r["k"] in ("frame", "close")]
        assert times == sorted(times), times
    assert ended == {"10.0.0.1:5001": "the proxy restarted"}, ended
    again = Index(saved)
    again.build()
    assert sorted((c.client, c.closed) for c in again.connections) == [
        ("10.0.0.1:5001", "the proxy restarted"), ("192.168.9.9:4444", "")]  # fmt: skip


def test_records_a_worker_dropped_mark_a_gap_in_its_frames_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--workers 2``: worker 0's ring loses records before the view asks,
    worker 1's does not. The view counts what was dropped, and marks the
    gap before worker 0's next frame only, not worker 1's."""
    index = LiveIndex("127.0.0.1:9")
    (taps0, tap0), (taps1, tap1) = restartable_proxy(), restartable_proxy()
    open_conn(taps0, 1, "10.0.0.1:5001")
    open_conn(taps1, 2, "10.0.0.2:6002")
    cursor = supervisor_ask(index, {0: tap0, 1: tap1}, "")
    monkeypatch.setattr(live_module, "MAX_RECORDS", 5)
    for _ in range(8):
        send_on(tap0, 1, "zero")  # 3 of them lost
    send_on(tap1, 2, "one")
    supervisor_ask(index, {0: tap0, 1: tap1}, cursor)
    assert index.dropped_upstream == 3
    rows = [(r["topic"], r["flags"]) for r in index.page(Filter(), 0, 10)["rows"]]
    assert rows == [("zero", ["gap"])] + [("zero", [])] * 4 + [("one", [])], rows

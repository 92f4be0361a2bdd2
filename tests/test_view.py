"""``sluice view``: a recorded session in a real headless Chromium (Debian's,
driven by Playwright), its JSON, the exported file with networking off, and
bad input."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import trio
from playwright.sync_api import Browser, Page, sync_playwright

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.recording import format as fmt
from sluice.view.index import Filter
from tests.helpers.support import SLUICE, RawClient, client, start_proxy
from tests.test_cursus_recording import recorded as cursus_session  # noqa: F401 - a fixture

pytestmark = pytest.mark.e2e  # every test here starts a process

ORDERS = "persistent://public/default/view-orders"
PAYMENTS = "persistent://public/default/view-payments"


@pytest.fixture(scope="module")
def capture(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Orders produced and consumed, payments produced, and one corrupt SEND
    (the proxy answers SEND_ERROR ChecksumError)."""
    tmp = tmp_path_factory.mktemp("view")
    record = tmp / "rec"
    proxy = start_proxy(broker.url, tmp, "--record", str(record), "--record-payloads", "full",
                        "--record-flush-interval", "0.1")  # fmt: skip
    try:
        with client(proxy.url) as c:
            producer = c.create_producer(ORDERS, batching_enabled=False)
            for i in range(30):
                producer.send(f"order-{i}".encode())
            consumer = c.subscribe(ORDERS, "s", initial_position=pulsar.InitialPosition.Earliest)
            for _ in range(30):
                consumer.acknowledge(consumer.receive(timeout_millis=10_000))
            payments = c.create_producer(PAYMENTS, batching_enabled=False)
            for i in range(10):
                payments.send(f"payment-{i}".encode())
        with RawClient(proxy.port) as raw:
            name = raw.producer(broker.port, ORDERS)
            raw.send_message(name, 1, 0, b"x", corrupt=True)
            raw.receive_type("SEND_ERROR")
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    return record


class Viewer:
    """``sluice view`` as a user starts it, stopped by PID."""

    def __init__(self, target: Path, *extra: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [*SLUICE, "view", str(target), "--listen", f"127.0.0.1:{self.port}", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                        break
                except OSError:
                    assert self.process.poll() is None, self.process.communicate(timeout=10)[0]
                    assert time.monotonic() < deadline, "sluice view did not listen"
                    time.sleep(0.05)
        except BaseException:
            self.stop()  # no test holds it yet to stop it
            raise

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + "api/" + path, timeout=10) as answer:
            return json.loads(answer.read())

    def built(self, timeout: float = 20) -> None:
        """Until the view has indexed the whole capture."""
        deadline = time.monotonic() + timeout
        while self.api("status")["building"]:
            assert time.monotonic() < deadline, "the view did not finish indexing"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def viewer(capture: Path) -> Iterator[Viewer]:
    v = Viewer(capture)
    yield v
    v.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed (./dev installs Debian's chromium package)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


def console_errors(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def wait_built(page: Page) -> None:
    """Until the page shows the whole capture's count (no longer indexing)."""
    page.wait_for_function(
        "() => /^\\(\\d+ match\\)$/.test(document.getElementById('count').textContent)"
    )


# The frames table holds only ``topic``'s frames, and all of them (one page).
SHOWN_ALIKE = """(topic) => {
  const topics = [...document.querySelectorAll('#frames tbody td.topic')].map((c) => c.textContent);
  return topics.length > 0 && topics.every((t) => t === topic)
    && document.getElementById('count').textContent === `(${topics.length} match)`;
}"""
DETAIL_CONNECTION = """() => {
  const terms = [...document.querySelectorAll("#detail dt")];
  const dt = terms.find((e) => e.textContent === "connection");
  return dt ? dt.nextElementSibling.textContent : null;
}"""


def test_the_page_shows_connections_filters_by_topic_and_shows_a_frame(
    viewer: Viewer, browser: Browser, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = console_errors(page)
    page.goto(viewer.url)
    wait_built(page)
    # The capture's connections: the client's lookup connection and its
    # proxied one, and the raw client's.
    kinds = page.locator("#connections tbody td:nth-child(2)").all_inner_texts()
    assert sorted(kinds) == ["lookup", "proxied", "proxied"]
    page.fill("input[name=topic]", "view-payments")
    page.click("button[type=submit]")
    page.wait_for_function(SHOWN_ALIKE, arg=PAYMENTS)
    topics = page.locator("#frames tbody td.topic").all_inner_texts()
    assert topics and all(t == PAYMENTS for t in topics)
    # All on one page: the count is the rows shown, 10 sends and their receipts among them.
    assert page.inner_text("#count") == f"({len(topics)} match)"
    commands = page.locator("#frames tbody td:nth-child(5)").all_inner_texts()
    assert (commands.count("SEND"), commands.count("SEND_RECEIPT")) == (10, 10), commands
    assert "topic=view-payments" in page.url  # the filter is in the link
    send = page.locator("#frames tbody tr", has_text="SEND").first
    send.click()
    page.wait_for_selector("#command")
    detail = page.inner_text("#detail")
    assert "SEND" in detail and "producer_id" in detail and "payment-" in detail
    assert "Raw bytes" in detail and "frame=" in page.url
    page.screenshot(path=str(tmp_path / "view.png"), full_page=True)
    assert (tmp_path / "view.png").stat().st_size > 30_000
    assert errors == []


def test_a_frames_detail_names_the_connection_its_row_shows(
    viewer: Viewer, browser: Browser
) -> None:
    """For a frame of each connection: the detail names the connection the
    table's row (and the connections table, by the server's ids) names."""
    page = browser.new_page()
    errors = console_errors(page)
    page.goto(viewer.url)
    wait_built(page)
    rows = page.eval_on_selector_all(
        "#frames tbody tr", "rows => rows.map((r) => [r.dataset.frame, r.cells[2].textContent])"
    )
    first = {conn: int(i) for i, conn in reversed(rows)}  # each connection's first frame
    names = {c["id"]: c["name"] for c in viewer.api("connections")}
    assert sorted(first) == sorted(names.values()) and len(first) == 3, (first, names)
    for conn, i in first.items():
        assert names[viewer.api(f"frame/{i}")["conn"]] == conn
        page.click(f'#frames tbody tr[data-frame="{i}"]')
        page.wait_for_function(
            f"() => document.querySelector('#detail dd')?.textContent.startsWith('#{i} ')"
        )
        assert page.evaluate(DETAIL_CONNECTION) == conn, f"frame #{i}"
    assert errors == []


def test_a_link_with_a_filter_opens_that_view(viewer: Viewer, browser: Browser) -> None:
    problems = viewer.api("frames?problems=1")
    error = next(r for r in problems["rows"] if r["cmd"] == "SEND_ERROR")
    page = browser.new_page()
    errors = console_errors(page)
    page.goto(f"{viewer.url}#problems=1&frame={error['i']}")
    page.wait_for_selector("#command")
    rows = page.locator("#frames tbody tr")
    assert rows.count() == problems["total"] == 2
    assert "ChecksumError" in page.inner_text("#frames") and "checksum" in page.inner_text(
        "#frames"
    )
    detail = page.inner_text("#detail")
    assert "SEND_ERROR" in detail and "ChecksumError" in detail and "answers" in detail
    assert page.locator("#timeline svg rect").count() >= 2
    assert errors == []


def test_the_timeline_joins_each_request_to_its_answer(viewer: Viewer, browser: Browser) -> None:
    viewer.built()
    timeline = viewer.api("timeline")
    ids = {m[0] for m in timeline["marks"]}
    lanes = {lane[0] for lane in timeline["lanes"]}
    joined = [m for m in timeline["marks"]
              if m[3] == 0 and m[5] >= 0 and m[5] in ids and m[1] in lanes]  # fmt: skip
    assert joined
    page = browser.new_page()
    errors = console_errors(page)
    page.goto(viewer.url)
    page.wait_for_selector("#timeline svg rect")
    assert page.locator("#timeline svg line.pair").count() == len(joined)
    assert errors == []


# The sequence diagram's arrows, in order: [frame, command (from the
# title), from lane, to lane, whether Sluice relays it (a dot on its lane)].
ARROWS = """() => [...document.querySelectorAll('#sequence .arrow')].map((g) => [
  Number(g.dataset.frame), g.querySelector('title').textContent.split(' ')[1],
  g.querySelector('line').getAttribute('x1'), g.querySelector('line').getAttribute('x2'),
  g.querySelector('circle') !== null, g.classList.contains('bad')])"""
LANES = """() => [...document.querySelectorAll('#sequence text.lane')].map((t) =>
  [t.textContent, t.getAttribute('x')])"""


def test_the_sequence_diagram_tells_each_connection_as_its_frames_do(
    viewer: Viewer, browser: Browser, tmp_path: Path
) -> None:
    """For every connection: one arrow per frame of the table, in the same
    order with the same commands; a relayed connection's arrows run between
    client and broker through Sluice, a lookup connection's between client
    and Sluice, and the refused corrupt SEND and Sluice's answer to it stop
    at Sluice, in red. An arrow shows its frame."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = console_errors(page)
    page.goto(viewer.url)
    wait_built(page)
    for conn in viewer.api("connections"):
        frames = viewer.api(f"frames?conn={conn['id']}&limit=400")["rows"]
        page.goto(f"{viewer.url}#conn={conn['id']}")
        page.wait_for_function(
            "() => "
            f"document.querySelectorAll('#sequence .arrow').length === {len(frames)} && "
            f"document.querySelector('#sequence .arrow')?.dataset.frame === '{frames[0]['i']}'"
        )
        arrows = page.evaluate(ARROWS)
        assert [(a[0], a[1]) for a in arrows] == [(f["i"], f["cmd"]) for f in frames]
        lanes = {name.split(" ")[0]: x for name, x in page.evaluate(LANES)}
        client, sluice = lanes["client"], lanes["Sluice"]
        for (i, cmd, x1, x2, through, bad), frame in zip(arrows, frames, strict=True):
            toward = frame["dir"] == "C→B"
            ends = (x1, x2) if toward else (x2, x1)  # (client's end, the other)
            assert ends[0] == client, (i, cmd)
            if conn["kind"] == "lookup":
                assert ends[1] == sluice and not through, (i, cmd)
            elif "invalid" in frame["flags"] or cmd == "SEND_ERROR":
                assert ends[1] == sluice and not through and bad, (i, cmd)
            else:
                assert ends[1] == lanes["broker"] and through, (i, cmd)
        assert len(lanes) == (2 if conn["kind"] == "lookup" else 3), lanes
    # An arrow is a link to its frame: the detail, and the table's row.
    arrow = page.locator("#sequence .arrow").nth(1)
    frame = arrow.get_attribute("data-frame")
    arrow.click()
    page.wait_for_function(
        f"() => document.querySelector('#detail dd')?.textContent.startsWith('#{frame} ')"
    )
    assert page.locator(f'#frames tbody tr.selected[data-frame="{frame}"]').count() == 1
    assert page.locator(f'#sequence .arrow.selected[data-frame="{frame}"]').count() == 1
    page.locator("#sequence").screenshot(path=str(tmp_path / "sequence.png"))
    assert errors == []


def test_the_plots_have_axes_units_values_and_a_time_range(
    viewer: Viewer, browser: Browser
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = console_errors(page)
    page.goto(viewer.url)
    wait_built(page)
    page.wait_for_selector("#rates")
    summary = viewer.api("summary")
    # Messages per second by topic: a line per topic and direction, with
    # the counts the capture holds (30 orders each way, 10 payments plus the
    # raw client's corrupt one).
    legend = page.locator(".legend li").all_inner_texts()
    assert "view-orders produced: 31 messages" in legend, legend
    assert "view-orders delivered: 30 messages" in legend, legend
    assert "view-payments produced: 10 messages" in legend, legend
    series = {(s["topic"], s["direction"]): s for s in summary["rates"]["series"]}
    orders = series[ORDERS, "produced"]
    bin_seconds = summary["rates"]["bin_seconds"]
    assert abs(sum(orders["per_second"]) * bin_seconds - 31) < 0.01
    rates = page.text_content("#rates") or ""  # SVG text: the axes
    assert "msg/s" in rates and " s" in rates and "time from the capture's start" in rates
    hover = page.locator("#rates circle title").all_text_contents()
    assert any(t.startswith(f"{ORDERS} produced: ") and "msg/s" in t for t in hover), hover[:3]
    # Latency histograms: bucket bounds in ms on the axis, counts over bars,
    # the count of answers; each bar says its bucket and count on hover.
    send = page.locator("svg.latency").first
    text = send.inner_html()
    assert "latency, ms" in text and ">answers<" in text and ">0.5<" in text
    bars = send.locator("rect title").all_text_contents()
    assert bars[0].startswith("≤ 0.5 ms: ") and bars[-1].startswith("> 5000 ms: ")
    answered = sum(int(t.rsplit(": ", 1)[1].split()[0]) for t in bars)
    assert answered == sum(next(iter(summary["latency"]["by_command"].values())))
    # The timeline's time axis, and the capture's time range.
    ticks = page.locator("#timeline text.axis").all_text_contents()
    assert "0 s" in ticks and len(ticks) >= 4, ticks
    assert " UTC" in page.inner_text("#range")
    assert errors == []


def test_an_exported_file_opens_with_networking_off(
    capture: Path, browser: Browser, tmp_path: Path
) -> None:
    out = tmp_path / "bug.html"
    command = [*SLUICE, "view", str(capture), "--export", str(out), "--filter", "topic=view-orders"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "matching frames" in done.stderr
    context = browser.new_context(offline=True)
    asked: list[str] = []

    def watch(route: Any) -> None:
        asked.append(route.request.url)
        route.continue_()

    context.route("**/*", watch)
    page = context.new_page()
    errors = console_errors(page)
    page.goto(out.as_uri())
    page.wait_for_selector("#frames tbody tr")
    assert "exported:" in page.inner_text("#status")
    topics = page.locator("#frames tbody td.topic").all_inner_texts()
    assert topics and set(topics) == {ORDERS}
    page.locator("#frames tbody tr", has_text="SEND").first.click()
    page.wait_for_selector("#command")
    assert "order-" in page.inner_text("#detail")
    # The sequence diagram of the exported frames, and the plots.
    assert page.locator("#sequence .arrow").count() == min(len(topics), 400)
    assert page.locator("#rates").count() == 1
    assert [url for url in asked if not url.startswith("file:")] == []  # nothing fetched
    assert errors == []
    context.close()


def test_bad_input_is_one_clear_line(capture: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run([*SLUICE, "view", str(empty)], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 2 and "no recordings" in result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*SLUICE, "view", str(capture), "--listen", f"127.0.0.1:{port}"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1 and "cannot listen" in result.stderr
    assert "Traceback" not in result.stderr
    # A torn last file and a format from the future: said in the page's status.
    torn = tmp_path / "torn"
    shutil.copytree(capture, torn)
    last = sorted(torn.glob("*.sluice"))[-1]
    last.write_bytes(last.read_bytes()[:-5])  # a writer killed inside its last record
    future = tmp_path / "future"
    future.mkdir()
    (future / "x.sluice").write_bytes(fmt.dumps([{**fmt.header(
        capture="c", segment=1, started_ns=0, payloads=fmt.PayloadPolicy.HASH,
        sluice_version="9"), "version": fmt.VERSION + 1}]))  # fmt: skip
    for target, said in ((torn, "incomplete record"), (future, "newer than this Sluice")):
        v = Viewer(target)
        try:
            deadline = time.monotonic() + 10
            while (status := v.api("status"))["building"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            v.stop()
        assert said in json.dumps(status), status
        assert said in v.process.communicate(timeout=10)[0]  # and on the command line


def test_python_dash_m_help() -> None:
    result = subprocess.run([sys.executable, "-m", "sluice", "view", "--help"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0 and "--export" in result.stdout


async def test_a_cursus_capture_reads_too(cursus_session: Path) -> None:  # noqa: F811 - the fixture
    """A Cursus session (produce, then stream with a consumer group): its
    frames, a batch's detail, the filters."""
    viewer = await trio.to_thread.run_sync(Viewer, cursus_session)
    try:

        def look() -> tuple[Any, Any, Any, Any]:
            deadline = time.monotonic() + 20
            while (status := viewer.api("status"))["building"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            frames = viewer.api("frames?limit=1000")
            streams = viewer.api("frames?cmd=STREAM")
            return status, frames, streams, viewer.api(f"frame/{frames['rows'][0]['i']}")

        status, frames, streams, detail = await trio.to_thread.run_sync(look)
    finally:
        viewer.stop()
    assert status["protocol"] == "cursus" and not status["error"]
    commands = {r["cmd"] for r in frames["rows"]}
    assert {"CREATE", "METADATA", "BATCH", "ACK", "JOIN_GROUP", "STREAM"} <= commands, commands
    assert streams["total"] >= 1 and all(r["cmd"] == "STREAM" for r in streams["rows"])
    assert "text" in detail["command"] and detail["raw_size"] > 0


def crafted_capture(directory: Path, topic: str = ORDERS, extra: list[Any] | None = None) -> Path:
    """A small written-by-hand Pulsar capture (as a bug report may carry):
    one connection, three SENDs on ``topic`` and their receipts, then ``extra``
    records."""
    t0, w0 = time.monotonic_ns(), time.time_ns()
    records: list[Any] = [
        fmt.header(capture="c1", segment=1, started_ns=w0, payloads=fmt.PayloadPolicy.HASH,
                   sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": t0, "w": w0, "client": "127.0.0.1:5000",
         "broker": "pulsar://127.0.0.1:6650", "kind": "proxied", "listener": "plain"},
    ]  # fmt: skip
    for i in range(3):
        records.append({"k": "frame", "c": 1, "d": 0, "t": t0 + 1000 * i, "w": w0, "n": 10,
                        "raw": b"", "p": [10], "s": {"cmd": "SEND", "topic": topic, "pid": 0,
                                                     "seq": i}})  # fmt: skip
        records.append({"k": "frame", "c": 1, "d": 1, "t": t0 + 1000 * i + 500, "w": w0, "n": 10,
                        "raw": b"", "p": [10], "s": {"cmd": "SEND_RECEIPT", "pid": 0,
                                                     "seq": i}})  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "a.sluice").write_bytes(fmt.dumps(records + (extra or [])))
    return directory


def test_an_exported_file_shows_a_topic_that_looks_like_markup(
    browser: Browser, tmp_path: Path
) -> None:
    """A topic name is the client's to choose: ``<!--<script>`` in it must
    not swallow the page's own script in the exported file."""
    topic = "persistent://public/default/<!--<script>"
    capture = crafted_capture(tmp_path / "capture", topic)
    out = tmp_path / "bug.html"
    done = subprocess.run([*SLUICE, "view", str(capture), "--export", str(out)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = browser.new_page()
    errors = console_errors(page)
    page.goto(out.as_uri())
    page.wait_for_function(
        "() => document.querySelectorAll('#frames tbody tr').length === 6", timeout=10_000
    )
    assert set(page.locator("#frames tbody td.topic").all_inner_texts()) == {topic, ""}
    assert "exported:" in page.inner_text("#status")
    assert errors == []


def test_a_crafted_capture_runs_no_script_in_the_page(browser: Browser, tmp_path: Path) -> None:
    """A capture attached to a bug report is anyone's to write: a payload
    size that is markup, not a number, is not shown as markup (nor at all),
    and whatever the page shows is escaped."""
    evil = '<img class="injected" src="x" onerror="document.title += \x27XSS\x27">'
    t0, w0 = time.monotonic_ns(), time.time_ns()
    capture = crafted_capture(tmp_path / "capture", extra=[
        {"k": "frame", "c": 1, "d": 0, "t": t0 + 10**9, "w": w0, "n": 3, "raw": b"",
         "p": [evil], "s": {"cmd": "SEND", "topic": evil}},
    ])  # fmt: skip
    v = Viewer(capture)
    try:
        v.built()
        page = browser.new_page()
        errors = console_errors(page)
        page.goto(f"{v.url}#frame=6")
        page.wait_for_function(
            "() => document.querySelector('#detail dd')?.textContent.startsWith('#6 ')"
        )
        page.wait_for_function("() => document.querySelectorAll('#frames tbody tr').length === 7")
        assert page.locator("img.injected").count() == 0
        assert evil in page.inner_text("#frames")  # shown as text
        assert "XSS" not in page.title()
        assert "payload" not in v.api("frame/6")
        assert v.api("frame/0")["payload"] == {"size": 10}
    finally:
        v.stop()
    assert errors == []


def test_a_record_the_index_cannot_hold_is_said_not_a_traceback(tmp_path: Path) -> None:
    """A frame whose size does not fit the index (a crafted capture): the
    page says the file is damaged there; the frames before it are shown."""
    t0, w0 = time.monotonic_ns(), time.time_ns()
    capture = crafted_capture(tmp_path / "capture", extra=[
        {"k": "frame", "c": 1, "d": 0, "t": t0 + 10**9, "w": w0, "n": 2**40, "raw": b"",
         "s": {"cmd": "SEND", "pid": 0, "seq": 9}},
    ])  # fmt: skip
    v = Viewer(capture)
    try:
        deadline = time.monotonic() + 20
        while (status := v.api("status"))["building"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        frames = v.api("frames")
    finally:
        v.stop()
    assert "damaged after" in status["error"] and "cannot take" in status["error"], status
    assert frames["total"] == 6 and frames["rows"][-1]["cmd"] == "SEND_RECEIPT"
    output = v.process.communicate(timeout=10)[0]
    assert "cannot take" in output and "Traceback" not in output


def refused_filters(
    tmp_path: Path, exports: tuple[str, ...], asked: tuple[str, ...], said: str
) -> None:
    """Each filter of ``exports`` refused by ``--export`` in one line (exit
    2), each question of ``asked`` by the server with a 400, both saying
    ``said``."""
    capture = crafted_capture(tmp_path / "capture")
    out = tmp_path / "x.html"
    for query in exports:
        done = subprocess.run(
            [*SLUICE, "view", str(capture), "--export", str(out), "--filter", query],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, (query, done.stderr)
        assert said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    v = Viewer(capture)
    try:
        for query in asked:
            with pytest.raises(urllib.error.HTTPError) as refused:
                v.api(query)
            assert refused.value.code == 400, query
            assert said in json.loads(refused.value.read())["error"], query
    finally:
        v.stop()


def test_an_infinite_filter_value_is_one_clear_line(tmp_path: Path) -> None:
    refused_filters(
        tmp_path,
        ("conn=inf", "from=1e400", "producer=-inf", "to=nan"),
        ("frames?conn=inf", "frames?from=inf", "timeline?producer=-inf", "sequence?to=-inf",
         "frames?conn=nan"),
        "finite number",
    )  # fmt: skip


def test_a_huge_time_filter_is_one_clear_line(tmp_path: Path) -> None:
    """A finite time too large for nanoseconds in 64 bits (``from=1e300``)
    is refused in one line, as an infinite one is: not a traceback from
    ``--export``, not a 500 from the server."""
    assert Filter.from_query({"from": "-9e9", "to": "9e9"}).end == 9e9
    refused_filters(
        tmp_path,
        ("from=1e300", "to=-1e300", "from=1e10"),
        ("frames?from=1e300", "timeline?to=1e300", "sequence?from=-1e300"),
        "between -9e9 and 9e9",
    )


def test_several_writers_files_are_one_capture_in_time_order(tmp_path: Path) -> None:
    """A ``--workers`` capture: one file per worker over the same time, read
    one after the other. The frames are in time order (each receipt still
    paired with its send), the capture's length is the whole span, and time
    starts at the earliest frame."""
    t0, w0, second = time.monotonic_ns(), time.time_ns(), 1_000_000_000

    def worker(name: str, conn: int, start: int, seconds: int) -> None:
        records: list[Any] = [
            fmt.header(capture=name, segment=1, started_ns=w0, payloads=fmt.PayloadPolicy.HASH,
                       sluice_version="x", protocol="pulsar"),
            {"k": "conn", "c": conn, "t": start, "w": w0, "client": f"10.0.0.{conn}:5000",
             "broker": "pulsar://b:6650", "kind": "proxied", "listener": "plain"},
        ]  # fmt: skip
        for s in range(seconds):
            for d, cmd in ((0, "SEND"), (1, "SEND_RECEIPT")):
                summary = {"cmd": cmd, "topic": f"w{conn}", "pid": 0, "seq": s}
                records.append({"k": "frame", "c": conn, "d": d, "t": start + s * second + d,
                                "w": w0, "n": 10, "raw": b"", "p": [10], "s": summary})  # fmt: skip
        (tmp_path / f"sluice-20250101T000000-{name}-0001.sluice").write_bytes(fmt.dumps(records))

    worker("aaaa", 1, t0, 60)  # worker 0: a minute
    worker("bbbb", 2, t0 - 5 * second, 10)  # worker 1: from 5 s before it, 10 s
    v = Viewer(tmp_path)
    try:
        v.built()
        summary = v.api("summary")
        rows = v.api("frames?limit=1000")["rows"]
        connections = v.api("connections")
    finally:
        v.stop()
    assert abs(summary["seconds"] - 64) < 0.01, summary["seconds"]
    assert len(rows) == 140 and rows[0]["t"] == 0
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert [r["i"] for r in rows] == list(range(140))
    for r in rows:
        asked = rows[r["pair"]]
        assert asked["pair"] == r["i"] and asked["conn"] == r["conn"], r
        assert (asked["cmd"], r["cmd"]) in (("SEND", "SEND_RECEIPT"), ("SEND_RECEIPT", "SEND"))
    assert sorted(c["start"] for c in connections) == [0, 5]

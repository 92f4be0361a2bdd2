"""``sluice faults`` against endpoints that answer something unexpected:
one line saying so, never a traceback."""

from __future__ import annotations

import argparse
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.commands import faults


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b"[]"

    def _answer(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json" if self.status == 200 else "text/html")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(handler: type[_Answer]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """An HTTP server that answers every call 200 with JSON that is no
    admin endpoint's (another service on the port --admin names)."""
    yield from _serve(_Answer)


class _Page(_Answer):
    status = 404
    body = (
        b"<html>\n<head><title>404 Not Found</title></head>\n<body>\n"
        + b"x" * 5000
        + b"\n</html>\n"
    )


def test_a_refusal_in_many_lines_is_told_in_one(capsys: pytest.CaptureFixture[str]) -> None:
    # A web server's HTML error page (--admin naming its port): it was
    # printed whole, every line of it.
    for address in _serve(_Page):
        code = faults.run(_args("list", "--admin", address))
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("sluice faults list: 404 Not Found: <html>")
    assert len(err) < 1100


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sluice faults")
    faults.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ("list",),
        ("add", "--drop"),
        ("clear",),
    ],
)
def test_an_answer_that_is_no_admin_endpoints_is_one_line(
    elsewhere: str, argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    code = faults.run(_args(argv[0], "--admin", elsewhere, *argv[1:]))
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "not what a Sluice admin endpoint answers" in err


def test_a_token_no_http_header_can_carry_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was 'answered something that is not JSON' (the UnicodeEncodeError
    # http.client raised before anything was sent).
    token = tmp_path / "token"
    token.write_text("s3cret-€\n", encoding="utf-8")
    code = faults.run(_args("clear", "--admin", "127.0.0.1:1", "--admin-token-file", str(token)))
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "not JSON" not in err
    assert f"--admin-token-file {token}: " in err and "HTTP header" in err


def test_options_beside_a_whole_rule_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # `--rule` is the whole rule: a --topic or --times beside it was
    # dropped without a word, and the rule fired on every topic.
    code = faults.run(_args("add", "--admin", "127.0.0.1:1", "--rule", '{"action": "drop"}',
                            "--topic", "orders-*", "--times", "3"))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--topic, --times" in err and "in its JSON" in err
    alone = _args("add", "--admin", "127.0.0.1:1", "--rule", '{"action": "drop"}')
    assert faults.rule_from(alone) == {"action": "drop"}


def test_a_rules_bounds_are_said_where_it_is_added_and_listed() -> None:
    """`faults add --probability 0.5 --after 99 --times 1` printed
    `disconnect on command=SEND`, as did `faults list`: only --json showed
    that the rule fires at most once, half the time, after 99 frames."""
    from sluice.commands.faults import describe

    rule = {"action": "disconnect", "match": {"command": "SEND"}, "probability": 0.5,
            "after": 99, "times": 1}  # fmt: skip
    assert describe(rule) == "disconnect on command=SEND p=0.5 after 99 times 1"
    assert describe({"action": "drop", "match": {}, "probability": 1.0, "after": 0,
                     "times": None}) == "drop on every frame"  # fmt: skip

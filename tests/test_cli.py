"""The command line as users meet it: help texts, version, and a self-contained checkout."""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from sluice import __version__
from sluice.commands import _subparsers, build_parser, main
from tests.helpers.support import SLUICE

ROOT = Path(__file__).resolve().parent.parent


def _commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command by its words, e.g. "proxy" and "faults add"."""
    found = {}
    for name, sub in _subparsers(parser).items():
        words = f"{prefix} {name}".strip()
        found[words] = sub
        found.update(_commands(sub, words))
    return found


SUBCOMMANDS = sorted(_commands(build_parser()))
# Metavars that name the unit of a numeric option (P: a probability, 0 to 1).
UNITS = {"SECONDS", "BYTES", "N", "PORT", "P"}


def _options(command: str) -> list[argparse.Action]:
    parser = _commands(build_parser())[command]
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def _help_entries(text: str) -> dict[str, str]:
    """Each option's entry in ``--help`` output, by its longest flag, as one line."""
    entries: dict[str, str] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("  -"):
            current = [line.strip()]
            flags = re.findall(r"--?[a-z][a-z0-9-]*", line.split("  ")[1])
            entries[max(flags, key=len)] = ""
            key = max(flags, key=len)
        elif current is not None and line.startswith("    "):
            current.append(line.strip())
        else:
            current = None
            continue
        entries[key] = " ".join(current)
    return entries


def test_every_subcommand_is_covered() -> None:
    assert {"proxy", "inspect", "replay", "serve", "analyze", "demo", "faults add",
            "faults list", "faults remove", "faults clear"} <= set(SUBCOMMANDS)  # fmt: skip


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_states_every_default_and_unit(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"])
    assert exit_.value.code == 0
    entries = _help_entries(capsys.readouterr().out)
    problems = []
    for action in _options(command):
        flag = max(action.option_strings, key=len)
        if not action.help:
            problems.append(f"{flag}: no help text")
            continue
        entry = entries.get(flag)
        assert entry is not None, f"{flag} missing from help"
        if action.nargs != 0 and "default" not in entry:  # switches are off unless given
            problems.append(f"{flag}: help does not state the default: {entry!r}")
        if action.type in (int, float) and action.metavar not in UNITS:
            problems.append(f"{flag}: numeric option without a unit metavar ({action.metavar})")
    assert not problems, "\n".join(problems)


def test_help_shows_the_actual_default_values(capsys: pytest.CaptureFixture[str]) -> None:
    # Each default is read in its own option's entry (a "(default: 5)" of
    # another option's is not --max-redirects'), and is the parser's.
    with pytest.raises(SystemExit) as exit_:
        main(["proxy", "--help"])
    assert exit_.value.code == 0
    entries = {
        flag: " ".join(entry.split())
        for flag, entry in _help_entries(capsys.readouterr().out).items()
    }
    defaults = {max(a.option_strings, key=len): a.default for a in _options("proxy")}
    for flag, metavar, default, said in (
        ("--max-connections", "N", 10000,
         "client connections open at once; more are refused (default: 10000)"),
        ("--drain-timeout", "SECONDS", 20.0, "(default: 20.0)"),
        ("--max-redirects", "N", 5, "(default: 5)"),
    ):  # fmt: skip
        assert defaults[flag] == default, flag
        entry = entries.get(flag, "")
        assert entry.startswith(f"{flag} {metavar} ") and entry.endswith(said), entry


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"sluice {__version__}"


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


@pytest.mark.e2e
def test_nothing_refers_outside_the_checkout() -> None:
    """A user's clone has nothing beside it: no file may reach for a sibling directory."""
    # Spelled as patterns so that this file does not match itself.
    outside = re.compile(r"\.\./shar[e]d|shar[e]d/referenc[e]|parent\s*/\s*\"shar[e]d\"")
    files = _repository_files()
    assert len(files) > 50  # the listing saw the repository
    offenders = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if outside.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("embedded", ["pulsar-lite", "apache-pulsar"])
@pytest.mark.e2e
def test_demo_runs_on_each_embedded_broker(embedded: str) -> None:
    """`sluice demo` (the README's first command) end to end, on both brokers."""
    done = subprocess.run(
        [*SLUICE, "demo", "--embedded", embedded, "--messages", "40"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "sent 40, received 40, in order" in done.stdout
    assert ", 0 invalid" in done.stdout
    assert f"(embedded {embedded}, pid " in done.stderr
    recording = re.search(r"recording +(\S+)", done.stdout)
    assert recording and Path(recording.group(1)).is_dir()
    shutil.rmtree(recording.group(1))


# --- bad input: one line and exit 2, never a traceback ---------------------------------

RECORDING = ROOT / "tests" / "golden" / "analyze" / "inputs"
CAPTURE = RECORDING / "sluice-20261128T172608-f2b453b65503-0001.sluice"


def _seconds_options() -> list[tuple[str, argparse.Action]]:
    return [
        (command, action)
        for command in SUBCOMMANDS
        for action in _options(command)
        if action.metavar == "SECONDS"
    ]


def _option_id(x: object) -> str:
    return x if isinstance(x, str) else max(x.option_strings)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("command", "action"), _seconds_options(), ids=_option_id)
def test_no_time_is_nan_or_infinite(command: str, action: argparse.Action) -> None:
    # Python's float takes both: a proxy given --handshake-timeout nan
    # failed at its first client, and replay --timeout -5 with a traceback.
    assert callable(action.type)
    for text in ("nan", "inf", "-inf", "-5"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            action.type(text)
    assert action.type("2.5") == 2.5


def test_faults_add_reads_its_options_without_command() -> None:
    # `faults add --command NAME` shared its dest with the command table's,
    # so without --command the whole line parsed as "no command given".
    args = build_parser().parse_args(["faults", "add", "--admin", "127.0.0.1:1", "--drop"])
    assert args.sluice_command == "faults"
    from sluice.commands.faults import rule_from

    assert rule_from(args) == {"match": {}, "action": "drop"}
    named = build_parser().parse_args(["faults", "add", "--admin", "x:1", "--command", "SEND",
                                        "--drop"])  # fmt: skip
    assert rule_from(named)["match"] == {"command": "SEND"}


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[proxi]\nlisten = '127.0.0.1:1'\n", "unknown setting 'proxi'"),
        ("connect-timeout = { a = 1 }\n", "connect-timeout: expected one value"),
        ("[proxy]\nconnect-timeout = nan\n", "'nan' is not a number of seconds"),
        (b"\xff\xfe", "not valid TOML: not UTF-8"),
    ],
)
def test_a_config_file_is_never_read_in_part_without_a_word(
    toml: str | bytes, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sluice.toml"
    if isinstance(toml, bytes):
        path.write_bytes(toml)
    else:
        path.write_text(toml)
    argv = ["proxy", "--config", str(path), "--broker", "pulsar://127.0.0.1:1", "--print-config"]
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_tables_of_other_commands_are_theirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text("[proxy]\nconnect-timeout = 3\n[view]\nlisten = '127.0.0.1:1'\n")
    argv = ["proxy", "--config", str(path), "--broker", "pulsar://127.0.0.1:1", "--print-config"]
    assert main(argv) == 0
    assert "connect-timeout = 3.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{capture}", "--pcap", "{capture}"],
        ["view", "{capture}", "--export", "{capture}"],
        ["replay", "{capture}", "--broker", "pulsar://127.0.0.1:1", "--transcript", "{capture}"],
        ["record", "anonymize", "{capture}", "{tmp}/anon", "--report", "{capture}"],
        ["inspect", "{tmp}", "--pcap", "{capture}"],
    ],
    ids=["inspect", "view", "replay", "anonymize", "in-directory"],
)
def test_no_output_overwrites_the_recording_being_read(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / CAPTURE.name
    shutil.copy(CAPTURE, capture)
    before = capture.read_bytes()
    code = main([a.format(capture=capture, tmp=tmp_path) for a in argv])
    assert code == 2
    assert "that is the recording being read" in capsys.readouterr().err
    assert capture.read_bytes() == before


@pytest.mark.parametrize(
    ("argv", "outputs"),
    [
        (["inspect", "{capture}", "--pcap", "{tmp}/out.pcapng"], ["out.pcapng"]),
        (["view", "{capture}", "--export", "{tmp}/out.html"], ["out.html"]),
        (["record", "anonymize", "{capture}", "{tmp}/anon", "--report", "{tmp}/report.json"],
         ["anon/" + CAPTURE.name, "report.json"]),
    ],
    ids=["pcap", "export", "anonymize"],
)  # fmt: skip
def test_outputs_holding_recorded_traffic_are_not_readable_by_every_user(
    argv: list[str], outputs: list[str], tmp_path: Path
) -> None:
    """A pcapng, an exported page, an anonymized copy and its report (which
    names what each pseudonym stands for) hold what the recording holds,
    created 0640 as recordings are. They were written 0644 (the umask's)."""
    capture = tmp_path / CAPTURE.name
    shutil.copy(CAPTURE, capture)
    old = os.umask(0o022)
    try:
        assert main([a.format(capture=capture, tmp=tmp_path) for a in argv]) == 0
    finally:
        os.umask(old)
    for name in outputs:
        found = next((tmp_path / name).parent.glob("*" + Path(name).suffix))
        assert found.stat().st_mode & 0o777 == 0o640, (found, oct(found.stat().st_mode))


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["inspect", "{capture}", "--pcap", "{tmp}/none/x.pcapng"], "no directory"),
        (["inspect", "{capture}", "--pcap", "{tmp}"], "is a directory"),
        (["view", "{capture}", "--export", "{tmp}/none/x.html"], "no directory"),
        (["replay", "{capture}", "--broker", "pulsar://127.0.0.1:1", "--transcript",
          "{tmp}/none/t.txt"], "no directory"),
        (["faults", "list", "--admin", "ftp://127.0.0.1:1"], "expected HOST:PORT"),
        (["demo", "--port", "45678", "--admin-port", "45678"], "must differ"),
        (["demo", "--record", "{capture}"], "exists and is not a directory"),
        (["demo", "--record", "{capture}/rec"], "rec: Not a directory"),
        (["proxy", "--broker", "pulsar://127.0.0.1:1", "--record", "{capture}/rec"],
         "is not a directory"),
        (["demo", "--port", "99999"], "a port is 1 to 65535"),
        (["proxy", "--broker", "pulsar://127.0.0.1:1", "--listener-ports", "20000-20010",
          "--broker-ports-file", "{tmp}"], "is a directory"),
        (["proxy", "--broker", "pulsar://127.0.0.1:1", "--admin-token-file", "{tmp}/token"],
         "give --admin too"),
        (["inspect", "{capture}", "--with-bytes"], "--with-bytes goes with --json"),
        (["analyze", "{capture}", "--out", "{tmp}/out", "--report", "{tmp}/none/r.html"],
         "no directory"),
    ],
)  # fmt: skip
def test_bad_paths_and_addresses_are_one_line(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / CAPTURE.name
    shutil.copy(CAPTURE, capture)
    (tmp_path / "token").write_text("a-token\n")
    try:
        code = main([a.format(capture=capture, tmp=tmp_path) for a in argv])
    except SystemExit as exc:  # a usage error, from argparse
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_a_pcap_of_a_damaged_recording_leaves_no_part_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / CAPTURE.name
    data = bytearray(CAPTURE.read_bytes())
    capture.write_bytes(bytes(data[:-40]) + b"\xc1" * 40)  # 0xc1: never valid msgpack
    out = tmp_path / "x.pcapng"
    out.write_bytes(b"an earlier capture")
    assert main(["inspect", str(capture), "--pcap", str(out)]) == 2
    assert "damaged" in capsys.readouterr().err
    assert out.read_bytes() == b"an earlier capture"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([capture.name, "x.pcapng"])
    shutil.copy(CAPTURE, capture)
    assert main(["inspect", str(capture), "--pcap", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"  # a pcapng section header
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([capture.name, "x.pcapng"])


def test_a_filter_list_in_the_environment_keeps_the_commas_of_its_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "SLUICE_FILTERS",
        'schema:{"topics": ["persistent://a/b/x*", "persistent://a/b/y*"], "direction": '
        '"produce"},tests.helpers.filters:Words:{"settings": {"word": "a,b"}}',
    )
    assert main(["proxy", "--broker", "pulsar://127.0.0.1:6650", "--print-config"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("filters = ")]
    assert line == (
        'filters = ["schema:{\\"topics\\": [\\"persistent://a/b/x*\\", \\"persistent://a/b/y*\\"]'
        ', \\"direction\\": \\"produce\\"}", "tests.helpers.filters:Words:{\\"settings\\": '
        '{\\"word\\": \\"a,b\\"}}"]  # environment'
    )


def test_an_abbreviated_flag_is_refused_not_merged_with_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag replaces the environment's list; an abbreviation would not be
    seen as that flag and would extend it, so flags are spelt whole."""
    monkeypatch.setenv("SLUICE_ALLOW_BROKER", "10.0.0.0/8")
    argv = ["proxy", "--broker", "pulsar://127.0.0.1:6650", "--print-config"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--allow-b", "127.0.0.1"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --allow-b 127.0.0.1" in capsys.readouterr().err
    assert main([*argv, "--allow-broker", "127.0.0.1"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("allow-broker")]
    assert line == 'allow-broker = ["127.0.0.1"]  # flag'


def test_an_environment_list_with_unbalanced_brackets_splits_at_every_comma() -> None:
    """Only balanced JSON keeps its commas: an item with a stray '{' does not
    swallow the items after it into one."""
    from sluice.config import _items

    assert _items('a:{"x": [1, 2]},b') == ['a:{"x": [1, 2]}', "b"]
    assert _items("10.0.0.0/8,{oops,*.svc") == ["10.0.0.0/8", "{oops", "*.svc"]
    assert _items('a:{"x": "1,2},b') == ['a:{"x": "1', "2}", "b"]


def test_only_the_proxy_reads_settings_from_the_environment_and_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SLUICE_* variables and SLUICE_CONFIG are the proxy's settings (a
    container sets them for it); `inspect` takes none of them, and must not
    fail on a file written for the proxy or read a flag from the environment."""
    flat = tmp_path / "flat.toml"
    flat.write_text("broker = 'pulsar://127.0.0.1:1'\n")
    monkeypatch.setenv("SLUICE_CONFIG", str(flat))
    monkeypatch.setenv("SLUICE_COMMAND", "NO_SUCH_COMMAND")  # would leave nothing shown
    assert main(["inspect", str(CAPTURE), "--summary"]) == 0
    out = capsys.readouterr().out
    assert "PRODUCER" in out
    # the proxy still reads both
    assert main(["proxy", "--print-config"]) == 0
    assert 'broker = "pulsar://127.0.0.1:1"  # file' in capsys.readouterr().out


def test_an_empty_config_flag_is_refused_not_taken_for_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config=` (a variable that expanded to nothing) was taken for no
    flag at all, and SLUICE_CONFIG's file was read in its place."""
    flat = tmp_path / "flat.toml"
    flat.write_text("broker = 'pulsar://127.0.0.1:1'\n")
    monkeypatch.setenv("SLUICE_CONFIG", str(flat))
    assert main(["proxy", "--config=", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err == "sluice proxy: --config names no file: give --config FILE\n"


@pytest.mark.parametrize("mode", [[], ["--summary"], ["--json", "--with-bytes"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(
    mode: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sluice inspect DIR | head` : the command stops with a shell's SIGPIPE
    status whatever it was writing (--json's 18 KB here fills the buffer
    before the end), not a BrokenPipeError traceback nor success."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before a line is written
    with os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert main(["inspect", str(CAPTURE), *mode]) == 141
        out.write("later output goes nowhere, quietly\n")
        out.flush()
    assert "Traceback" not in capsys.readouterr().err


def test_printed_settings_read_back_as_the_same_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--print-config's output is a config file: fed back with --config it
    gives every value again (lists stay lists; a token's claim or a key
    file's path is not a secret to mask)."""
    argv = ["proxy", "--broker", "pulsar://127.0.0.1:1", "--auth-token-role-claim", "role",
            "--auth-token-public-key", str(tmp_path / "k.pem"),
            "--auth-oidc-audiences", "a,b", "--print-config"]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out
    settings = tmp_path / "printed.toml"
    settings.write_text(first)
    assert main(["proxy", "--config", str(settings), "--print-config"]) == 0
    again = capsys.readouterr().out

    def values(text: str) -> list[str]:
        return [line.rsplit("  # ", 1)[0] for line in text.splitlines()[1:]]

    assert values(again) == values(first)
    assert 'auth-token-role-claim = "role"' in values(first)
    assert 'auth-oidc-issuers = ""' in values(first)
    assert 'auth-oidc-audiences = "a,b"' in values(first)


@pytest.mark.parametrize("flag", ["--max-message-size", "--max-frame-size"])
def test_a_frame_size_past_32_bits_is_refused_up_front(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 GiB used to pass, and then the compiled frame path (32-bit sizes)
    failed every client's CONNECT with an OverflowError."""
    argv = ["proxy", "--broker", "pulsar://127.0.0.1:1", flag]
    assert main([*argv, "4294967296"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be at most 2147483647" in err, err
    assert "Traceback" not in err
    assert main([*argv, "2147483647"]) == 1  # accepted; then the broker is not there
    assert "cannot reach broker" in capsys.readouterr().err


def test_a_file_cap_smaller_than_a_file_head_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--record-max-bytes 10 used to start, then write a file per write,
    each over the cap."""
    argv = ["proxy", "--broker", "pulsar://127.0.0.1:1", "--record", str(tmp_path / "r")]
    assert main([*argv, "--record-max-bytes", "10"]) == 2
    err = capsys.readouterr().err
    assert (
        "--record-max-bytes 10 cannot hold a file's header and a record; give at least 4096" in err
    )
    assert main([*argv, "--record-max-bytes", "4096"]) == 1  # accepted; no broker there
    assert "cannot reach broker" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "{fifo}", "--broker", "pulsar://127.0.0.1:1"],
        ["record", "anonymize", "{fifo}", "{tmp}/anon"],
    ],
    ids=["replay", "anonymize"],
)
def test_ctrl_c_in_the_middle_of_work_is_one_line_and_status_130(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while a command reads (a capture that is slow to come: here a
    named pipe whose writer sends nothing) ends it with a shell's status for
    SIGINT and one line, not a KeyboardInterrupt traceback."""
    fifo = tmp_path / "slow.sluice"
    os.mkfifo(fifo)
    writers: list[int] = []

    def interrupt_once_read() -> None:
        writers.append(os.open(fifo, os.O_WRONLY))  # returns once the command opened it
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = threading.Thread(target=interrupt_once_read, daemon=True)
    thread.start()
    try:
        code = main([a.format(fifo=fifo, tmp=tmp_path) for a in argv])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left main as a KeyboardInterrupt (a traceback)")
    finally:
        signal.signal(signal.SIGINT, previous)
        thread.join(5)
        for fd in writers:
            os.close(fd)
    assert code == 130
    err = capsys.readouterr().err
    assert err.endswith(f"sluice {' '.join(argv[:2] if argv[0] == 'record' else argv[:1])}: "
                        "interrupted\n"), err  # fmt: skip
    assert "Traceback" not in err


def test_a_closed_standard_output_is_said_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sluice inspect CAPTURE >&-` starts with no sys.stdout: the summary
    it cannot show is said to be lost, in one line, with status 2."""
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["inspect", str(CAPTURE), "--summary"]) == 2
    err = capsys.readouterr().err
    assert err == "sluice inspect: standard output is closed: what it would show is lost\n"
    # a command whose output goes to a file still works
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["inspect", str(CAPTURE), "--pcap", os.devnull]) == 0


@pytest.mark.e2e
def test_demo_sends_more_messages_than_the_clients_queue_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The batched half was sent without waiting for room in the client's
    queue (1000 messages): past it sends failed unseen, were counted as
    sent, and the demo waited for them, then said 'Pulsar error: TimeOut'."""
    assert main(["demo", "--messages", "5000"]) == 0
    out = capsys.readouterr().out
    assert "sent 5000, received 5000, in order" in out, out
    recording = re.search(r"recording +(\S+)", out)
    assert recording is not None
    shutil.rmtree(recording.group(1))


def test_demo_counts_a_batched_send_the_client_failed_as_not_sent() -> None:
    import pulsar

    from sluice.commands.demo import Receipts

    receipts = Receipts()
    receipts.answered(pulsar.Result.Ok, None)
    receipts.answered(pulsar.Result.ProducerQueueIsFull, None)
    assert receipts.failed == ["Result.ProducerQueueIsFull"]
    assert receipts.problem() == "1 batched sends failed (Result.ProducerQueueIsFull)"
    assert receipts.done.acquire(timeout=0) and receipts.done.acquire(timeout=0)


@pytest.mark.e2e
def test_demo_whose_reader_stops_early_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sluice demo | head -2`: the status a shell gives a command SIGPIPE
    ended, as inspect's, not 'sluice demo: [Errno 32] Broken pipe' and 1."""
    record = Path(tempfile.mkdtemp(prefix="sluice-demo-test-"))
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        try:
            assert main(["demo", "--messages", "4", "--record", str(record)]) == 141
        finally:
            shutil.rmtree(record)
    err = capsys.readouterr().err
    assert "Broken pipe" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("existing", [False, True], ids=["new", "empty"])
def test_an_anonymize_that_fails_half_way_leaves_no_half_copy(
    existing: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy that fails after its first file (here: the second's name in
    OUT is past the system's longest path; a full disk or Ctrl-C alike)
    left the first file in OUT, and a second try was refused ('exists and
    is not an empty directory'). OUT is now as it was before the run."""
    source = tmp_path / "src"
    deep = source.joinpath(*["z" * 8] * 12)  # read second; each a longer pseudonym in the copy
    deep.mkdir(parents=True)
    shutil.copy(CAPTURE, source / CAPTURE.name)
    shutil.copy(CAPTURE, deep / CAPTURE.name)
    out = tmp_path.joinpath(*["o" * 200] * 19)
    out = out / ("o" * (4000 - len(str(out))))  # the first copy's path fits, the second's not
    if existing:
        out.mkdir(parents=True)
    code = main(["record", "anonymize", str(source), str(out)])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("sluice record anonymize: ") and "File name too long" in err, err
    assert err.count("\n") == 1
    assert out.exists() == existing
    assert not existing or not any(out.iterdir())


def test_a_path_that_is_not_utf8_is_written_as_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a UTF-8 locale (whose stdout is strict, unlike C.UTF-8's), a
    capture in a directory named in Latin-1 made the summary, once read,
    fail with a UnicodeEncodeError traceback where it names the file."""
    directory = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    directory.mkdir()
    (directory / "a.sluice").write_bytes(CAPTURE.read_bytes()[:3000])  # its last record cut
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["inspect", str(directory), "--summary"]) == 0
    out.flush()
    assert bytes(tmp_path) + b"/caf\xe9/a.sluice: ends with " in raw.getvalue()


def test_analyze_help_names_every_table_it_writes() -> None:
    from sluice.analyze.job import TABLES

    description = _subparsers(build_parser())["analyze"].description or ""
    named = set(re.findall(r"[a-z_]+", description.split("tables", 1)[1].split(";")[0]))
    assert set(TABLES) <= named, set(TABLES) - named


def test_record_max_bytes_takes_a_size_as_record_retain_bytes_does() -> None:
    """The docs (and the chart's schema, a string) give it as 64K; it took
    only a number of bytes (`invalid int value: '64K'`)."""
    args = build_parser().parse_args(
        ["proxy", "--broker", "pulsar://127.0.0.1:1", "--record-max-bytes", "64K"]
    )
    assert args.record_max_bytes == 64 * 1024
    args = build_parser().parse_args(
        ["proxy", "--broker", "pulsar://127.0.0.1:1", "--record-max-bytes", "1048576"]
    )
    assert args.record_max_bytes == 1048576


@pytest.mark.parametrize("flag", ["--http-max-body", "--record-ring"])
def test_a_size_that_rounds_to_no_byte_is_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.5 was taken as 0 bytes: --http-max-body 0 bytes, and --record-ring
    0 then became the default 256 MiB ring without a word."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["proxy", "--broker", "pulsar://127.0.0.1:1", flag, "0.5"])
    assert exit_.value.code == 2
    assert "at least one byte" in capsys.readouterr().err

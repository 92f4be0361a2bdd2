"""``sluice faults``: add, list and remove a running proxy's fault rules.

A thin client of the admin endpoint's ``/faults`` (see
``sluice.proxy.admin``); the rules themselves are described in
``sluice.protocols.faults`` and docs/faults.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from sluice.addresses import parse_address
from sluice.commands import path_arg
from sluice.commands.proxy import read_token
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.protocols.faults import Direction, FaultError, check_jitter, parse_rule

TIMEOUT = 10.0
# The most of a refusal's text shown (the admin endpoint's are one short line).
MAX_MESSAGE = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(
        dest="faults_command", metavar="ACTION", required=True, parser_class=type(parser)
    )
    add = actions.add_parser(
        "add", help="add a rule", description="Add a fault rule to a running proxy."
    )
    _common(add)
    match = add.add_argument_group("which frames (all optional; none: every frame)")
    match.add_argument(
        "--protocol",
        help=f"one of {', '.join(registry.all_faults())} (default: any but http, which a rule "
        "for the HTTP listener's requests names)",
    )
    match.add_argument(
        "--command",
        metavar="NAME",
        help="command name as in the protocol, e.g. SEND_RECEIPT (default: any)",
    )
    match.add_argument(
        "--topic",
        metavar="GLOB",
        help="topic glob; without '://' it matches the local name, e.g. 'orders-*'; for http, "
        "a request path glob starting with '/' (default: any)",
    )
    match.add_argument(
        "--direction",
        choices=[d.value for d in Direction],
        help="to_broker or to_client (default: both)",
    )
    match.add_argument(
        "--client", metavar="GLOB", help="client address glob, IP or IP:PORT (default: any)"
    )
    what = add.add_argument_group("what to do (exactly one)")
    one = what.add_mutually_exclusive_group(required=True)
    one.add_argument(
        "--delay",
        metavar="DURATION",
        type=_duration_ms,
        help="hold each frame this long, keeping order (e.g. 300ms, 1.5s; "
        "no default: give one action)",
    )
    one.add_argument("--drop", action="store_true", help="the frame never arrives")
    one.add_argument(
        "--corrupt", action="store_true", help="flip a payload byte so that the checksum fails"
    )
    one.add_argument(
        "--disconnect", action="store_true", help="close both sides right after the frame"
    )
    one.add_argument(
        "--error",
        metavar="CODE",
        nargs="?",
        const="",
        help="answer the request in the broker's place with this error code of the "
        "protocol (default: the protocol's own, Pulsar ServiceNotReady, Cursus NOT_LEADER; "
        "for http, a status, default 503); a code only one protocol knows needs --protocol",
    )
    one.add_argument(
        "--throttle",
        metavar="BYTES_PER_S",
        type=_rate,
        help="pace the matched frames to this rate (e.g. 65536, 64K, 1M; no default)",
    )
    one.add_argument(
        "--rule",
        metavar="JSON",
        help="the whole rule as JSON instead of these options (no default)",
    )
    bound = add.add_argument_group("how often")
    bound.add_argument(
        "--jitter",
        metavar="DURATION",
        type=_duration_ms,
        help="with --delay: up to this much more or less (default: 0ms)",
    )
    bound.add_argument(
        "--probability",
        type=float,
        metavar="P",
        help="chance of firing on each matching frame (default: 1.0)",
    )
    bound.add_argument(
        "--after", type=int, metavar="N", help="let the first N matching frames pass (default: 0)"
    )
    bound.add_argument(
        "--times", type=int, metavar="N", help="fire at most N times (default: no limit)"
    )
    add.add_argument(
        "--message",
        metavar="TEXT",
        help="with --error: the error message (default: injected by sluice)",
    )
    add.add_argument("--id", metavar="ID", help="the rule's id (default: assigned, f1, f2, …)")

    show = actions.add_parser(
        "list",
        help="list the rules and their hit counts",
        description="List a running proxy's fault rules.",
    )
    _common(show)
    show.add_argument("--json", action="store_true", help="print the JSON the proxy answers")

    remove = actions.add_parser(
        "remove", help="remove one rule", description="Remove one fault rule by id."
    )
    _common(remove)
    remove.add_argument("id", metavar="ID", help="the rule's id, as `list` shows it")

    clear = actions.add_parser(
        "clear", help="remove every rule", description="Remove every fault rule."
    )
    _common(clear)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin",
        required=True,
        metavar="HOST:PORT",
        help="the proxy's admin endpoint (its --admin); required, no default",
    )
    parser.add_argument(
        "--admin-token-file",
        type=path_arg,
        metavar="FILE",
        help="file holding the proxy's admin token (default: none; changing rules needs it)",
    )


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")


def _duration_ms(text: str) -> float:
    """'300ms', '1.5s', '2m' or a bare number of milliseconds."""
    found = _DURATION.match(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 300ms, 1.5s)")
    value = float(found.group(1))
    return value * {"ms": 1, None: 1, "s": 1000, "m": 60_000}[found.group(2)]


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)(?:i?B)?(?:/s)?\s*$")


def _rate(text: str) -> int:
    """Bytes per second: '65536', '64K', '1M' (K and M are 1024 and 1024²)."""
    found = _RATE.match(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (e.g. 65536, 64K, 1M)")
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[found.group(2).lower()]
    return int(float(found.group(1)) * scale)


_MATCH = ("protocol", "command", "topic", "direction", "client")


def rule_from(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON rule ``sluice faults add``'s options describe."""
    if args.rule is not None:
        # The JSON is the whole rule: an option beside it would be dropped
        # without a word (a --topic meant to narrow it, an --id to name it).
        beside = [
            "--" + key.replace("_", "-")
            for key in (*_MATCH, "jitter", "probability", "after", "times", "message", "id")
            if getattr(args, key) is not None
        ]
        if beside:
            raise ConfigError(
                f"--rule is the whole rule: put {', '.join(beside)} in its JSON instead"
            )
        try:
            rule: dict[str, Any] = json.loads(args.rule)
        except ValueError as exc:
            raise ConfigError(f"--rule is not JSON: {exc}") from None
        return _checked(rule, lambda _: "--rule")
    if args.id == "":  # the proxy would pick one, which the caller cannot name
        raise ConfigError("--id is empty: give the rule an id, or no --id")
    if args.jitter is not None:
        if args.delay is None:  # (the proxy would refuse it: exit 1, for a usage error)
            raise ConfigError("--jitter goes with --delay")
        check_jitter(args.delay, args.jitter, names=("--delay", "--jitter"), unit="ms")
    match = {key: getattr(args, key) for key in _MATCH if getattr(args, key)}
    rule = {"match": match}
    if args.delay is not None:
        rule.update(action="delay", delay_ms=args.delay)
    elif args.drop:
        rule["action"] = "drop"
    elif args.corrupt:
        rule["action"] = "corrupt"
    elif args.disconnect:
        rule["action"] = "disconnect"
    elif args.error is not None:
        rule["action"] = "error"
        if args.error:
            rule["error"] = args.error
    else:
        rule.update(action="throttle", rate=args.throttle)
    for key, value in (
        ("jitter_ms", args.jitter),
        ("probability", args.probability),
        ("after", args.after),
        ("times", args.times),
        ("message", args.message),
        ("id", args.id),
    ):
        if value is not None:
            rule[key] = value
    return _checked(rule, lambda exc: _option_at_fault(str(exc), args))


def _checked(rule: dict[str, Any], named: Callable[[FaultError], str]) -> dict[str, Any]:
    """``rule`` as the proxy reads it (``parse_rule``): one it would refuse
    is a mistake in the command line (exit 2, the option ``named`` names
    first), said even with the proxy down, not its refusal (exit 1, as if
    it were down)."""
    try:
        parse_rule(rule, registry.all_faults())
    except FaultError as exc:
        raise ConfigError(f"{named(exc)}: {exc}") from None
    return rule


# The option that gave the rule field a refusal names (``parse_rule`` says
# what is wrong in the JSON's words), by how the refusal begins (what
# follows may quote the user's values), first match wins.
_AT_FAULT = (
    (re.compile(r"unknown protocol |match\.protocol "), "--protocol"),
    (re.compile(r"unknown command |match\.command |an error rule answers requests: (?!its )"),
     "--command"),
    (re.compile(r"\w+ rules match |match\.direction|an error rule answers requests: its "),
     "--direction"),
    (re.compile(r"match\.topic "), "--topic"),
    (re.compile(r"match\.client "), "--client"),
    (re.compile(r"unknown error code |error "), "--error"),
    (re.compile(r"rate "), "--throttle"),
    (re.compile(r"jitter_ms "), "--jitter"),
    (re.compile(r"delay_ms |a delay rule "), "--delay"),
    (re.compile(r"probability "), "--probability"),
    (re.compile(r"after "), "--after"),
    (re.compile(r"times "), "--times"),
    (re.compile(r"message "), "--message"),
    (re.compile(r"id "), "--id"),
)  # fmt: skip
_ACTIONS = ("delay", "drop", "corrupt", "disconnect", "error", "throttle")


def _option_at_fault(refusal: str, args: argparse.Namespace) -> str:
    """The option of ``sluice faults add`` that a refusal of the rule its
    options built is about; the action's (``--drop`` …) where it is about
    the action (``http rules may delay, …, not corrupt``) or none is named."""
    for pattern, option in _AT_FAULT:
        if pattern.match(refusal):
            return option
    given = [
        f"--{a}" for a in _ACTIONS if getattr(args, a) is not None and getattr(args, a) is not False
    ]
    return given[0] if given else "the options"


class AdminError(Exception):
    """The admin endpoint refused the call or could not be reached."""


def call(admin: str, method: str, path: str, token: str | None = None, body: object = None) -> Any:
    """One admin call; its JSON answer. AdminError says why it failed."""
    address = parse_address(admin, what="--admin")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{address}{path}", data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        message = " ".join(exc.read().decode(errors="replace").split())  # one line
        if len(message) > MAX_MESSAGE:  # e.g. a web server's error page
            message = message[:MAX_MESSAGE] + "…"
        raise AdminError(f"{exc.code} {exc.reason}: {message}") from None
    except http.client.HTTPException as exc:  # e.g. InvalidURL: nothing was sent
        raise AdminError(f"cannot call {address}{path}: {exc}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AdminError(f"cannot reach the admin endpoint at {address}: {reason}") from None
    except ValueError as exc:
        raise AdminError(f"{address} answered something that is not JSON: {exc}") from None


def describe(rule: dict[str, Any]) -> str:
    match = " ".join(f"{k}={v}" for k, v in rule.get("match", {}).items()) or "every frame"
    action = rule.get("action", "?")
    if action == "delay":
        action = f"delay {rule.get('delay_ms', 0):g}ms"
        if rule.get("jitter_ms"):
            action += f"±{rule['jitter_ms']:g}ms"
    elif action == "throttle":
        action = f"throttle {rule.get('rate')} B/s"
    elif action == "error":
        action = f"error {rule.get('error') or '(the protocol default)'}"
    bounds = []
    if rule.get("probability", 1) != 1:
        bounds.append(f"p={rule['probability']:g}")
    if rule.get("after"):
        bounds.append(f"after {rule['after']}")
    if rule.get("times") is not None:
        bounds.append(f"times {rule['times']}")
    return " ".join([f"{action} on {match}", *bounds])


def _header_safe(token: str) -> bool:
    """Whether ``token`` can go in ``Authorization`` (http.client writes
    headers in Latin-1)."""
    try:
        token.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    try:
        token = read_token(args.admin_token_file)
        if token is not None and not _header_safe(token):
            raise ConfigError(f"--admin-token-file {args.admin_token_file}: the token holds "
                              "characters an HTTP header cannot carry (make one of ASCII: "
                              "openssl rand -hex 16)")  # fmt: skip
        command = args.faults_command
        if command == "add":
            answer = call(args.admin, "POST", "/faults", token, rule_from(args))
            print(f"added {answer['id']}: {describe(answer['rule'])}")
        elif command == "list":
            answer = call(args.admin, "GET", "/faults", token)
            if args.json:
                print(json.dumps(answer, indent=2))
            elif not answer["rules"]:
                print("no fault rules")
            else:
                print(f"{'ID':<8} {'HITS':>8}  RULE")
                for rule in answer["rules"]:
                    print(f"{rule['id']:<8} {rule['hits']:>8}  {describe(rule)}")
        elif command == "remove":
            if not args.id:
                raise ConfigError("remove needs a rule id (clear removes every rule)")
            # An id that is not UTF-8 (typed in a Latin-1 terminal) is sent as
            # its bytes: the endpoint says whether it has such a rule.
            rule_id = urllib.parse.quote(args.id, safe="", errors="surrogateescape")
            call(args.admin, "DELETE", "/faults/" + rule_id, token)
            print(f"removed {args.id}")
        else:
            answer = call(args.admin, "DELETE", "/faults", token)
            print(f"removed {answer['deleted']} rule(s)")
    except ConfigError as exc:
        print(f"sluice faults: {exc}", file=sys.stderr)
        return 2
    except AdminError as exc:
        print(f"sluice faults {args.faults_command}: {exc}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, AttributeError, ValueError):
        # JSON, but not a Sluice admin endpoint's answer (another service on
        # that port): one line, as for every other failure.
        print(f"sluice faults {args.faults_command}: {args.admin} answered JSON that is not "
              "what a Sluice admin endpoint answers (is --admin the proxy's --admin?)",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0

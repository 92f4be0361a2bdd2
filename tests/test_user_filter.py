"""A filter as a user writes it: tests/example_filter/, a distribution of its
own (the example of docs/filters.md) whose entry point names ``mask-json``.

Its author tests it by calling its hook (no proxy, no broker), and its
settings through Sluice's own checker. Then it is installed as a user would
(pip, into a directory of its own, offline), run in ``sluice proxy`` by name,
and a consumer reading direct from Apache Pulsar sees what the broker
stored: the masked messages, batched and compressed ones included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import free_port
from sluice.filters import DELIVER, PASS, PRODUCE, Filter, Message, Replace
from sluice.filters.chain import Filters
from sluice.filters.config import FilterConfigError, FilterSpec, load, parse_flag

# The unit tests import the source tree's package (here, inside the tests
# package: its author would import sluice_example_filter); the end-to-end
# tests install it and run it by its entry point's name.
from tests.example_filter.sluice_example_filter import MaskJsonFields
from tests.helpers.poll import wait_until
from tests.helpers.support import SLUICE, ProxyProcess, client, start_proxy, wait_ready
from tests.test_dashboards import scrape, value

EXAMPLE = Path(__file__).resolve().parent / "example_filter"
SOURCE_CLASS = "tests.example_filter.sluice_example_filter:MaskJsonFields"

FILTER = (
    'mask-json:{"topics": ["persistent://public/default/masked-*"], "direction": "produce", '
    '"settings": {"fields": ["ssn", "card"]}}'
)
TOPIC = "persistent://public/default/people"


def _mask(*fields: str, **settings: str) -> MaskJsonFields:
    return MaskJsonFields(MaskJsonFields.Settings(fields=list(fields), **settings))


def _produced(document: Any, **properties: str) -> Message:
    payload = document if isinstance(document, bytes) else json.dumps(document).encode()
    return Message(PRODUCE, TOPIC, payload, properties)


def _compact(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


# --- the hook, called directly ---------------------------------------------------------


def test_fields_are_masked_at_any_depth_in_objects() -> None:
    document = {
        "name": "ada",
        "ssn": "123-45-6789",
        "address": {"street": "1 Main St", "ssn": "987-65-4321"},
        "payment": {"method": {"card": {"number": "4111111111111111", "cvv": "123"}}},
    }
    masked = {
        "name": "ada",
        "ssn": "***",
        "address": {"street": "1 Main St", "ssn": "***"},
        "payment": {"method": {"card": "***"}},  # the whole value, an object too
    }
    verdict = _mask("ssn", "card").on_produce(_produced(document))
    assert verdict == Replace(payload=_compact(masked), properties={"masked-by": "sluice"})


def test_fields_are_masked_inside_arrays() -> None:
    document = {
        "people": [{"ssn": "1"}, {"name": "bob", "kids": [{"ssn": "2"}, [{"ssn": "3"}]]}],
        "tags": ["ssn", "card"],  # values, not field names: kept
        "ssn": ["4", "5"],
    }
    masked = {
        "people": [{"ssn": "***"}, {"name": "bob", "kids": [{"ssn": "***"}, [{"ssn": "***"}]]}],
        "tags": ["ssn", "card"],
        "ssn": "***",
    }
    verdict = _mask("ssn").on_produce(_produced(document))
    assert verdict == Replace(payload=_compact(masked), properties={"masked-by": "sluice"})


@pytest.mark.parametrize(
    "payload",
    [
        b"ssn=123-45-6789",
        b'{"ssn": "123-45-6789"',  # cut short
        b'{"ssn": "\xff\xfe"}',  # not UTF-8
        b"",
        b'"ssn"',  # JSON, but not an object
        b"[1, 2]",
    ],
)
def test_what_is_not_a_json_object_passes_unchanged(payload: bytes) -> None:
    assert _mask("ssn").on_produce(_produced(payload)) is PASS


def test_what_cannot_be_written_back_raises() -> None:
    """Sluice then refuses it (on-error closed): better than stored unmasked."""
    with pytest.raises(ValueError, match="Out of range float values"):
        _mask("ssn").on_produce(_produced(b'{"ssn": "1", "big": 1e400}'))


def test_a_message_with_nothing_to_mask_passes() -> None:
    f = _mask("ssn", "card")
    assert f.on_produce(_produced({"name": "ada", "cards": 2, "nested": {"x": [1]}})) is PASS
    assert f.on_produce(_produced({"ssn": "***", "n": {"card": "***"}})) is PASS  # masked already
    # Encrypted payloads and tombstones are not read at all.
    secret = Message(PRODUCE, TOPIC, b'{"ssn": "1"}', encrypted=True)
    assert f.on_produce(secret) is PASS
    assert f.on_produce(Message(PRODUCE, TOPIC, b"", null=True)) is PASS


def test_the_property_is_added_and_the_others_kept() -> None:
    f = _mask("ssn", mask="[redacted]", property="x-masked", property_value="yes")
    message = _produced({"ssn": "1", "name": "Zoë"}, origin="crm", trace="t-1")
    verdict = f.on_produce(message)
    assert verdict == Replace(
        payload='{"ssn":"[redacted]","name":"Zoë"}'.encode(),
        properties={"origin": "crm", "trace": "t-1", "x-masked": "yes"},
    )
    assert message.properties == {"origin": "crm", "trace": "t-1"}  # the message is not changed


def test_deliveries_are_left_alone() -> None:
    """No on_deliver of its own: Sluice gives it no delivery chain (and so
    does not unpack delivered batches for it)."""
    assert MaskJsonFields.on_deliver is Filter.on_deliver
    filters = Filters(load([_flag({"topics": ["persistent://public/default/masked-*"],
                                   "settings": {"fields": ["ssn"]}})]))  # fmt: skip
    masked_topic = "persistent://public/default/masked-people"
    assert filters.chain(masked_topic, PRODUCE, None) is not None
    assert filters.chain(masked_topic, DELIVER, None) is None
    assert filters.chain(TOPIC, PRODUCE, None) is None  # not a topic it names


# --- settings, checked by Sluice --------------------------------------------------------


def _flag(table: dict[str, Any]) -> FilterSpec:
    """``--filter`` for the source tree's class (module:attr), named as installed."""
    return parse_flag(f"{SOURCE_CLASS}:" + json.dumps({"label": "mask-json", **table}))


def _problems(settings: dict[str, Any]) -> list[str]:
    with pytest.raises(FilterConfigError) as caught:
        load([_flag({"settings": settings})])
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def test_settings_mistakes_are_one_line_each() -> None:
    assert _problems({}) == ["filter 'mask-json': setting 'fields' is required"]
    assert _problems({"fields": "ssn"}) == [
        "filter 'mask-json': setting 'fields' must be a list of strings, not 'ssn'"
    ]
    assert _problems({"fields": ["ssn"], "colour": "red"}) == [
        "filter 'mask-json': unknown setting 'colour' "
        "(known: fields, mask, property, property_value)"
    ]
    assert _problems({"fields": []}) == [
        "filter 'mask-json': setting 'fields' must name at least one field"
    ]
    # Every mistake at once, not the first only.
    assert _problems({"field": ["ssn"], "mask": 3}) == [
        "filter 'mask-json': unknown setting 'field' "
        "(known: fields, mask, property, property_value)",
        "filter 'mask-json': setting 'fields' is required",
        "filter 'mask-json': setting 'mask' must be a string, not 3",
    ]


def test_good_settings_make_the_filter() -> None:
    [loaded] = load([_flag({"settings": {"fields": ["ssn"], "property-value": "edge"}})])
    assert isinstance(loaded.filter, MaskJsonFields)
    assert loaded.filter.settings == MaskJsonFields.Settings(
        fields=["ssn"], mask="***", property="masked-by", property_value="edge"
    )


# --- installed, in `sluice proxy`, against Apache Pulsar --------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The distribution installed as a user would: pip builds and installs it
    (offline: setuptools from this environment) into a directory of its own.
    From a copy: an in-tree build leaves build/ and *.egg-info behind."""
    root = tmp_path_factory.mktemp("example-filter")
    source, target = root / "source", root / "site"
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    shutil.copytree(EXAMPLE, source, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
           "--no-index", "--no-cache-dir", "--disable-pip-version-check"]  # fmt: skip
    run = subprocess.run(
        [*pip, "--target", str(target), str(source)], capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stdout + run.stderr
    [info] = target.glob("sluice_example_filter-0.1.0.dist-info")
    entry_points = (info / "entry_points.txt").read_text()
    assert "mask-json = sluice_example_filter:MaskJsonFields" in entry_points
    return target


def _path_with(site: Path) -> str:
    return os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="module")
def masking_proxy(
    apache_pulsar: ApachePulsar, site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProxyProcess, int]]:
    admin = free_port()
    with pytest.MonkeyPatch.context() as patch:  # start_proxy passes its environment on
        patch.setenv("PYTHONPATH", _path_with(site))
        proxy = start_proxy(
            apache_pulsar.url, tmp_path_factory.mktemp("masking-proxy"),
            "--filter", FILTER, "--admin", f"127.0.0.1:{admin}",
        )  # fmt: skip
    try:
        wait_ready(admin)
        yield proxy, admin
    finally:
        proxy.terminate()
    assert "Traceback" not in proxy.log(), proxy.log()


def _read_until(consumer: pulsar.Consumer, last: bytes) -> list[pulsar.Message]:
    """Every message up to and including the one whose payload is ``last``."""
    got: list[pulsar.Message] = []
    while not got or got[-1].data() != last:
        assert len(got) < 50, [m.data() for m in got]
        message = consumer.receive(timeout_millis=15_000)
        consumer.acknowledge(message)
        got.append(message)
    return got


def _replaced(proxy: ProxyProcess, admin: int) -> float:
    samples = scrape(proxy, admin)
    return value(
        samples, "sluice_filter_replaced_total", filter="mask-json", direction="client_to_broker"
    )


def test_the_broker_stores_what_the_installed_filter_masked(
    apache_pulsar: ApachePulsar, masking_proxy: tuple[ProxyProcess, int]
) -> None:
    proxy, admin = masking_proxy
    suffix = uuid.uuid4().hex[:8]
    masked_topic = f"persistent://public/default/masked-{suffix}"
    plain_topic = f"persistent://public/default/plain-{suffix}"
    person = {"name": "ada", "ssn": "123-45-6789", "card": {"number": "4111", "cvv": "1"}}
    one_by_one: list[tuple[bytes, dict[str, str], bytes, dict[str, str]]] = [
        # sent, its properties; stored, its properties
        (_compact(person), {"origin": "crm"},
         b'{"name":"ada","ssn":"***","card":"***"}', {"origin": "crm", "masked-by": "sluice"}),
        (b'{"name": "bob"}', {}, b'{"name": "bob"}', {}),
        (b"ssn=123-45-6789", {}, b"ssn=123-45-6789", {}),
    ]  # fmt: skip
    batch: list[tuple[bytes, bytes, dict[str, str]]] = [
        (b'{"id": 0, "ssn": "1"}', b'{"id":0,"ssn":"***"}', {"masked-by": "sluice"}),
        (b'{"id": 1, "orders": [{"card": "4111"}, {"card": "5500"}]}',
         b'{"id":1,"orders":[{"card":"***"},{"card":"***"}]}', {"masked-by": "sluice"}),
        (b'{"id": 2}', b'{"id": 2}', {}),
        (b'{"id": 3, "people": [{"name": "x", "ssn": "2"}]}',
         b'{"id":3,"people":[{"name":"x","ssn":"***"}]}', {"masked-by": "sluice"}),
    ]  # fmt: skip
    end = b"end of test"
    before = _replaced(proxy, admin)
    with client(apache_pulsar.url) as direct, client(proxy.url) as through:
        earliest = pulsar.InitialPosition.Earliest
        stored = direct.subscribe(masked_topic, "direct", initial_position=earliest)
        stored_plain = direct.subscribe(plain_topic, "direct", initial_position=earliest)

        single = through.create_producer(masked_topic, batching_enabled=False)
        for payload, properties, _, _ in one_by_one:
            single.send(payload, properties=properties)
        batched = through.create_producer(
            masked_topic, batching_enabled=True, batching_max_messages=len(batch),
            batching_max_publish_delay_ms=60_000, compression_type=pulsar.CompressionType.LZ4,
        )  # fmt: skip
        results: dict[int, str] = {}
        for i, (payload, _, _) in enumerate(batch):
            batched.send_async(payload, lambda r, _id, i=i: results.__setitem__(i, str(r)))
        batched.flush()
        wait_until(
            lambda: len(results) == len(batch),
            20,
            f"answers to the batch sends (at the start: {results})",
            step=0.05,
        )
        assert results == dict.fromkeys(range(len(batch)), "Result.Ok")
        single.send(end)

        plain = through.create_producer(plain_topic, batching_enabled=False)
        plain.send(_compact(person), properties={"origin": "crm"})
        plain.send(end)

        got = _read_until(stored, end)
        got_plain = _read_until(stored_plain, end)

    expected = [(stored, props) for _, _, stored, props in one_by_one]
    expected += [(stored, props) for _, stored, props in batch]
    expected += [(end, {})]
    assert [(m.data(), m.properties()) for m in got] == expected
    # The batch was stored as one batch (one entry), its messages in order.
    ids = [m.message_id() for m in got[3:7]]
    assert len({(i.ledger_id(), i.entry_id()) for i in ids}) == 1, ids
    assert [i.batch_index() for i in ids] == [0, 1, 2, 3]
    # A topic the filter does not name: stored exactly as sent.
    assert [(m.data(), m.properties()) for m in got_plain] == [
        (_compact(person), {"origin": "crm"}), (end, {}),
    ]  # fmt: skip
    # One count per changed message: 1 sent alone, 3 in the batch.
    deadline = time.monotonic() + 20
    while (counted := _replaced(proxy, admin) - before) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counted == 4, f"sluice_filter_replaced_total counted {counted} masked messages, not 4"


@pytest.mark.e2e
def test_the_proxy_refuses_to_start_without_the_required_setting(site: Path) -> None:
    def proxy_with_filter(pythonpath: str) -> subprocess.CompletedProcess[str]:
        args = [*SLUICE, "proxy", "--listen", f"127.0.0.1:{free_port()}",
                "--broker", "pulsar://127.0.0.1:6650", "--filter", "mask-json"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": pythonpath}
        return subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)

    run = proxy_with_filter(_path_with(site))
    assert (run.returncode, run.stdout) == (2, ""), run.stdout + run.stderr
    assert run.stderr.splitlines() == [
        "sluice proxy: filter 'mask-json': setting 'fields' is required"
    ]
    # Not installed, it is not found: the name comes from the installed entry point.
    run = proxy_with_filter(os.environ.get("PYTHONPATH", ""))
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.startswith("sluice proxy: filter 'mask-json': no such filter"), run.stderr
    assert "Traceback" not in run.stderr

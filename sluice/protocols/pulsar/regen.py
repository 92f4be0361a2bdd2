"""Regenerate ``pulsar_api_pb2.py`` (and its ``.pyi`` stub) from ``proto/pulsar_api.proto``.

The schema source lives at the top of the repository (``proto/``); the
generated module lives here, in the package. Run
``python -m sluice.protocols.pulsar.regen`` after editing the schema. The generated
files are committed so that installing Sluice needs no protoc; the test suite
regenerates into a scratch directory and fails if the committed copy is stale.

This is a developer tool: it needs ``grpcio-tools`` and ``mypy-protobuf``
(both in the ``test`` extra), which the runtime package does not depend on.
The stub comes from mypy-protobuf because protoc's own ``--pyi_out`` writes
invalid Python for an enum value named ``None`` (``Schema.Type.None``).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# In a checkout; an installed package ships only the generated module.
SCHEMA = HERE.parents[2] / "proto" / "pulsar_api.proto"
GENERATED = ("pulsar_api_pb2.py", "pulsar_api_pb2.pyi")


def generate(out_dir: Path, schema: Path = SCHEMA) -> list[Path]:
    """Compile ``schema`` into ``out_dir``; return the files written."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "grpcio-tools is needed to regenerate the schema: pip install -e '.[test]'"
        ) from exc
    plugin = Path(sys.executable).parent / "protoc-gen-mypy"
    if not plugin.exists():
        found = shutil.which("protoc-gen-mypy")
        if found is None:
            raise SystemExit("mypy-protobuf is needed to regenerate the schema stub")
        plugin = Path(found)
    out_dir.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(
        [
            "protoc",
            f"--plugin=protoc-gen-mypy={plugin}",
            f"--proto_path={schema.parent}",
            f"--python_out={out_dir}",
            f"--mypy_out=quiet:{out_dir}",
            str(schema),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed on {schema} (exit {rc})")
    return [out_dir / name for name in GENERATED]


def main() -> None:
    for path in generate(HERE):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
    sys.exit(0)

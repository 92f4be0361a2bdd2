"""Our schema against the upstream one, and the generated module against our schema."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from sluice.proto import regen
from tests.conftest import reference_dir

Flat = dict[tuple[str, str], Any]


def _descriptor(proto: Path) -> descriptor_pb2.FileDescriptorProto:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        rc = protoc.main(
            [
                "protoc",
                f"--proto_path={proto.parent}",
                f"--descriptor_set_out={out}",
                str(proto),
            ]
        )
        assert rc == 0, f"protoc rejected {proto}"
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]


def _flatten(fd: descriptor_pb2.FileDescriptorProto) -> Flat:
    """Everything that reaches the wire, keyed by fully qualified name."""
    flat: Flat = {}

    def enum(e: descriptor_pb2.EnumDescriptorProto, scope: str) -> None:
        flat[("enum", scope + e.name)] = sorted((v.name, v.number) for v in e.value)

    def message(m: descriptor_pb2.DescriptorProto, scope: str) -> None:
        name = scope + m.name
        flat[("message", name)] = sorted(
            (
                f.name,
                f.number,
                f.type,
                f.label,
                f.type_name,
                f.default_value,
                f.oneof_index if f.HasField("oneof_index") else None,
            )
            for f in m.field
        )
        flat[("oneofs", name)] = [o.name for o in m.oneof_decl]
        for e in m.enum_type:
            enum(e, name + ".")
        for nested in m.nested_type:
            message(nested, name + ".")

    for e in fd.enum_type:
        enum(e, "")
    for m in fd.message_type:
        message(m, "")
    return flat


def test_schema_matches_upstream_wire_contract() -> None:
    ours = _flatten(_descriptor(regen.SCHEMA))
    upstream = _flatten(_descriptor(reference_dir() / "PulsarApi.proto"))
    missing = sorted(set(upstream) - set(ours))
    extra = sorted(set(ours) - set(upstream))
    differing = sorted(k for k in set(ours) & set(upstream) if ours[k] != upstream[k])
    assert not missing, f"definitions missing from our schema: {missing}"
    assert not extra, f"definitions upstream does not have: {extra}"
    assert not differing, "definitions that differ:\n" + "\n".join(
        f"{k}:\n  ours     {ours[k]}\n  upstream {upstream[k]}" for k in differing
    )
    # Sanity: the comparison saw the whole protocol (v21 has 100+ definitions).
    assert len(upstream) > 200


def test_schema_has_its_own_comments() -> None:
    """Comments are ours: no line of commentary is copied from upstream."""

    def comments(path: Path) -> set[str]:
        found = set()
        for line in path.read_text().splitlines():
            if "//" in line:
                text = line.split("//", 1)[1].strip()
                if len(text) > 20:
                    found.add(text)
        return found

    shared = comments(regen.SCHEMA) & comments(reference_dir() / "PulsarApi.proto")
    assert not shared, f"comments copied from upstream: {sorted(shared)}"


def test_generated_module_is_current() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in regen.generate(Path(tmp)):
            committed = regen.HERE / fresh.name
            assert committed.read_text() == fresh.read_text(), (
                f"{committed.name} is stale: run `python -m sluice.proto.regen`"
            )

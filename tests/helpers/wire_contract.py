"""The Pulsar wire contract as data: what of a ``.proto`` file reaches the wire.

For every message, each field's name, number, type, label, type name, default
and oneof; for every enum, each value's name and number. Comments, option
order and formatting are left out: they never reach the wire.

``tests/data/pulsar_wire_contract.json`` holds upstream's contract (protocol
v21), written once with::

    python -m tests.helpers.wire_contract PATH/TO/upstream/PulsarApi.proto

It also keeps the SHA-256 of each long upstream comment line (not the text),
so a test can tell that our schema's comments are our own without the
upstream file being present.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

CONTRACT = Path(__file__).resolve().parent.parent / "data" / "pulsar_wire_contract.json"
# Shorter comment lines ("required", "deprecated") are common words, not prose.
COMMENT_MIN_CHARS = 21

Contract = dict[str, Any]


def descriptor(proto: Path) -> descriptor_pb2.FileDescriptorProto:
    """``proto`` compiled by the protoc inside grpcio-tools."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        rc = protoc.main(
            ["protoc", f"--proto_path={proto.parent}", f"--descriptor_set_out={out}", str(proto)]
        )
        if rc != 0:
            raise ValueError(f"protoc rejected {proto}")
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]


def contract_of(fd: descriptor_pb2.FileDescriptorProto) -> Contract:
    """Messages and enums keyed by their name inside the package."""
    messages: dict[str, Any] = {}
    enums: dict[str, dict[str, int]] = {}

    def enum(e: descriptor_pb2.EnumDescriptorProto, scope: str) -> None:
        enums[scope + e.name] = {v.name: v.number for v in e.value}

    def message(m: descriptor_pb2.DescriptorProto, scope: str) -> None:
        name = scope + m.name
        messages[name] = {
            "fields": [
                {
                    "name": f.name,
                    "number": f.number,
                    "type": descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                    "label": descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                    "type_name": f.type_name,
                    "default": f.default_value,
                    "oneof": m.oneof_decl[f.oneof_index].name
                    if f.HasField("oneof_index")
                    else None,
                }
                for f in sorted(m.field, key=lambda f: f.number)
            ],
            "oneofs": [o.name for o in m.oneof_decl],
        }
        for e in m.enum_type:
            enum(e, name + ".")
        for nested in m.nested_type:
            message(nested, name + ".")

    for e in fd.enum_type:
        enum(e, "")
    for m in fd.message_type:
        message(m, "")
    return {"package": fd.package, "syntax": fd.syntax or "proto2", "messages": messages,
            "enums": enums}  # fmt: skip


def comment_lines(proto_text: str) -> set[str]:
    """The long ``//`` comment lines of a schema, stripped."""
    found = set()
    for line in proto_text.splitlines():
        if "//" in line:
            text = line.split("//", 1)[1].strip()
            if len(text) >= COMMENT_MIN_CHARS:
                found.add(text)
    return found


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m tests.helpers.wire_contract UPSTREAM_PulsarApi.proto", file=sys.stderr
        )
        return 2
    upstream = Path(argv[0])
    contract = contract_of(descriptor(upstream))
    contract["comment_sha256"] = sorted(digest(c) for c in comment_lines(upstream.read_text()))
    CONTRACT.parent.mkdir(parents=True, exist_ok=True)
    CONTRACT.write_text(json.dumps(contract, indent=1, sort_keys=True) + "\n")
    print(f"wrote {CONTRACT}: {len(contract['messages'])} messages, {len(contract['enums'])} enums")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Print ``tinker_public.proto`` recovered from the installed SDK's descriptor (its wheel ships
only the generated ``tinker/proto/tinker_public_pb2.py``), under MinT's own package name.

    .venv/bin/python -m gateway.tinker.proto.recover > gateway/tinker/proto/tinker_public.proto

The package is renamed (``tinker_public`` → :data:`PACKAGE`) and the file keeps its path in this
repository, so the vendored messages and the SDK's (imported by tests that drive the SDK in the
same process) live side by side in protobuf's default pool; neither changes a byte on the wire.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2

PACKAGE = "mint.tinker_public"
F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    F.TYPE_DOUBLE: "double",
    F.TYPE_FLOAT: "float",
    F.TYPE_INT64: "int64",
    F.TYPE_UINT64: "uint64",
    F.TYPE_INT32: "int32",
    F.TYPE_FIXED64: "fixed64",
    F.TYPE_FIXED32: "fixed32",
    F.TYPE_BOOL: "bool",
    F.TYPE_STRING: "string",
    F.TYPE_BYTES: "bytes",
    F.TYPE_UINT32: "uint32",
    F.TYPE_SFIXED32: "sfixed32",
    F.TYPE_SFIXED64: "sfixed64",
    F.TYPE_SINT32: "sint32",
    F.TYPE_SINT64: "sint64",
}


def _type(field: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    if field.type in (F.TYPE_MESSAGE, F.TYPE_ENUM):
        return field.type_name.removeprefix(f".{package}.")
    return SCALARS[field.type]


def _message(msg: descriptor_pb2.DescriptorProto, package: str, indent: str = "") -> list[str]:
    entries = {n.name: n for n in msg.nested_type if n.options.map_entry}
    lines = [f"{indent}message {msg.name} {{"]
    inner = indent + "  "
    for nested in msg.nested_type:
        if not nested.options.map_entry:
            lines += _message(nested, package, inner)
    for enum in msg.enum_type:
        lines += _enum(enum, inner)

    def field_line(field: descriptor_pb2.FieldDescriptorProto, pad: str) -> str:
        entry = entries.get(field.type_name.rsplit(".", 1)[-1])
        if field.type == F.TYPE_MESSAGE and entry is not None:
            key, value = entry.field
            kind = f"map<{_type(key, package)}, {_type(value, package)}>"
        else:
            label = "repeated " if field.label == F.LABEL_REPEATED else ""
            label += "optional " if field.proto3_optional else ""
            kind = label + _type(field, package)
        return f"{pad}{kind} {field.name} = {field.number};"

    real_oneofs = {
        f.oneof_index for f in msg.field if f.HasField("oneof_index") and not f.proto3_optional
    }
    done: set[int] = set()
    for field in msg.field:
        if field.HasField("oneof_index") and field.oneof_index in real_oneofs:
            index = field.oneof_index
            if index in done:
                continue
            done.add(index)
            lines.append(f"{inner}oneof {msg.oneof_decl[index].name} {{")
            for member in msg.field:
                if member.HasField("oneof_index") and member.oneof_index == index:
                    lines.append(field_line(member, inner + "  "))
            lines.append(f"{inner}}}")
        else:
            lines.append(field_line(field, inner))
    lines.append(f"{indent}}}")
    return lines


def _enum(enum: descriptor_pb2.EnumDescriptorProto, indent: str = "") -> list[str]:
    lines = [f"{indent}enum {enum.name} {{"]
    lines += [f"{indent}  {v.name} = {v.number};" for v in enum.value]
    return lines + [f"{indent}}}"]


def recover(fd: descriptor_pb2.FileDescriptorProto, package: str = PACKAGE) -> str:
    """The ``.proto`` text of ``fd`` (proto3 files without services or custom options)."""
    assert fd.syntax == "proto3" and not fd.service and not fd.dependency, fd.name
    lines = [
        "// Recovered from the serialized descriptor in the tinker SDK's tinker_public_pb2.py",
        "// (PyPI tinker 0.38.0) by gateway/tinker/proto/recover.py; only the package is renamed.",
        'syntax = "proto3";',
        "",
        f"package {package};",
    ]
    for enum in fd.enum_type:
        lines += ["", *_enum(enum)]
    for msg in fd.message_type:
        lines += ["", *_message(msg, fd.package)]
    return "\n".join(lines) + "\n"


def main() -> None:
    from tinker.proto import tinker_public_pb2  # the SDK: a dev dependency, only here

    fd = descriptor_pb2.FileDescriptorProto()
    tinker_public_pb2.DESCRIPTOR.CopyToProto(fd)
    print(recover(fd), end="")


if __name__ == "__main__":
    main()

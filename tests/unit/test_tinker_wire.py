"""The Tinker protobuf codec (gateway/tinker/wire.py on the vendored gateway/tinker/proto): the
vendored messages equal the SDK's, what the SDK sends decodes, what it reads back is what was
meant, every malformed body is a WireError naming what was wrong (a table and a fuzz), and the
forward_backward route keeps its body limit (413) and decodes off the event loop."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import httpx
import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinker import types
from tinker.proto import tinker_public_pb2 as sdk_pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import (
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from gateway import GatewayConfig
from gateway.main import ThreadedServer
from gateway.service import Gateway
from gateway.tinker import router, wire
from gateway.tinker.futures import FuturesTable
from gateway.tinker.proto import recover
from gateway.tinker.proto import tinker_public_pb2 as pb
from gateway.tinker.service import TinkerApi
from schemas.events.steps import MAX_STEP_DATUMS, MAX_STEP_TOKENS
from tests.unit.test_tinker_api import BASE, FakeCatalog, FakeEngines, FakeTrainer

MODEL = "tk00000000:train:0"
PROTO = {"Content-Type": "application/x-protobuf"}


def _file(module) -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fd)
    return fd


def _local(proto, package: str):
    """A message or enum descriptor with its type names made relative to ``package``."""
    out = type(proto)()
    out.CopyFrom(proto)
    for f in getattr(out, "field", []):
        f.type_name = f.type_name.removeprefix(f".{package}.")
    for nested in getattr(out, "nested_type", []):
        nested.CopyFrom(_local(nested, package))
    return out


def test_vendored_messages_equal_the_sdk_descriptor() -> None:
    mine, theirs = _file(pb), _file(sdk_pb)
    assert mine.syntax == theirs.syntax == "proto3"
    assert [m.name for m in mine.message_type] == [m.name for m in theirs.message_type]
    assert [e.name for e in mine.enum_type] == [e.name for e in theirs.enum_type]
    for a, b in zip(mine.message_type, theirs.message_type, strict=True):
        # names, numbers, labels, types, message/enum types, oneofs, map entries
        assert _local(a, mine.package) == _local(b, theirs.package), a.name
    for a, b in zip(mine.enum_type, theirs.enum_type, strict=True):
        assert a == b, a.name
    # the vendored .proto is what recover.py prints from this SDK (and protoc made pb from it)
    vendored = Path(pb.__file__).with_name("tinker_public.proto").read_text()
    assert vendored == recover.recover(theirs)


def _datum(n: int, **extra: types.TensorData | list) -> types.Datum:
    tokens = list(range(1, n + 2))
    inputs = {"target_tokens": tokens[1:], "weights": [1.0] * n, **extra}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def _body(datums: list[types.Datum], loss_fn: str = "cross_entropy", **kwargs) -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=datums, loss_fn=loss_fn, loss_fn_config=kwargs.pop("config", None)
        ),
        model_id=MODEL,
        seq_id=kwargs.pop("seq_id", 7),
    )
    return forward_backward_request_to_proto(req).SerializeToString()


def test_sdk_bodies_decode_as_meant() -> None:
    ppo = _datum(
        3,
        logprobs=[-0.5, -1.0, -1.5],
        advantages=types.TensorData.from_numpy(np.array([1.0, -1.0, 0.5], dtype=np.float32)),
    )
    body = _body([_datum(2), ppo], "ppo", config={"clip_low_threshold": 0.8}, seq_id=12)
    got = wire.decode_forward_backward(body)
    assert (got.model_id, got.seq_id, got.loss_fn, got.forward_only) == (MODEL, 12, "ppo", False)
    assert got.loss_fn_config == {"clip_low_threshold": 0.8}
    assert [d.tokens for d in got.data] == [[1, 2], [1, 2, 3]]
    assert got.data[0].inputs["target_tokens"].tolist() == [2, 3]
    assert got.data[0].inputs["target_tokens"].dtype == np.int64
    assert got.data[1].inputs["logprobs"].tolist() == [-0.5, -1.0, -1.5]
    assert got.data[1].inputs["advantages"].tolist() == [1.0, -1.0, 0.5]
    assert got.data[1].inputs["weights"].dtype == np.float32
    assert wire.decode_forward_backward(b"") == wire.FwdBwdRequest("", 0, "", {}, False, [])


def test_answers_read_back_through_the_sdk() -> None:
    out = deserialize_forward_backward_output(
        wire.encode_forward_backward_output([[-0.5, -1.25], [], [-3.0]], {"loss:sum": 2.5})
    )
    assert out.metrics == {"loss:sum": 2.5}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-0.5, -1.25], [], [-3.0]]
    sample = deserialize_sample_response(
        wire.encode_sample_response(
            [
                wire.WireSequence("stop", [1, 2, 3], [-0.25, -0.5, -1.0]),
                wire.WireSequence("length", [], None),
            ]
        )
    )
    assert [(s.stop_reason, s.tokens) for s in sample.sequences] == [
        ("stop", [1, 2, 3]),
        ("length", []),
    ]
    assert sample.sequences[0].logprobs == [-0.25, -0.5, -1.0]
    assert sample.sequences[1].logprobs is None


def _tensor(**fields) -> pb.Tensor:
    return pb.Tensor(**{"dense": b"\0" * 8, "dtype": pb.DTYPE_INT64, **fields})


def _request(*, chunk: pb.Chunk | None = None, inputs: dict | None = None, **fields) -> bytes:
    datum = pb.Datum(
        model_input=[chunk or pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=b"\1\0\0\0"))],
        loss_fn_inputs=inputs if inputs is not None else {"target_tokens": _tensor()},
    )
    return pb.ForwardBackwardRequest(
        model_id=MODEL, seq_id=1, data=[datum], **fields
    ).SerializeToString()


def _key(number: int, wire_type: int) -> bytes:
    return bytes([number << 3 | wire_type])


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field, written by hand."""
    size, length = len(payload), bytearray()
    while size > 0x7F:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    return _key(number, 2) + bytes(length) + bytes([size]) + payload


VALID = _request()
MALFORMED = {
    "seq_id as bytes": (_key(2, 2) + b"\x017", r"seq_id \(field 2\) came as length-delimited"),
    "model_id as a varint": (_key(1, 0) + b"\x05", r"model_id \(field 1\) came as a varint"),
    "forward_only as fixed64": (_key(6, 1) + b"\0" * 8, r"forward_only .* 8 fixed bytes"),
    "bad UTF-8 in model_id": (_key(1, 2) + b"\x02\xff\xfe", "bad UTF-8"),
    "bad UTF-8 in an input's name": (
        _request(inputs={"x": _tensor()}).replace(b"\x01x", b"\x01\xff"),
        "bad UTF-8",
    ),
    "truncated": (VALID[:-1], "not a protobuf ForwardBackwardRequest"),
    "a length past the end": (_key(1, 2) + b"\x7fabc", "not a protobuf"),
    "an unended varint": (_key(2, 0) + b"\xff" * 11, "not a protobuf"),
    "wire type 7": (_key(2, 7), "not a protobuf"),
    "an unclosed group": (_key(9, 3), "not a protobuf"),
    "field number 0": (b"\x00\x01", "not a protobuf"),
    "nesting past the limit": (
        b"".join(_key(3, 2) + bytes([0x7F]) for _ in range(200)),
        "not a protobuf",
    ),
    "an empty chunk": (
        _request(chunk=pb.Chunk()),
        r"data\[0\]\.model_input\[0\] is an empty chunk",
    ),
    "a text chunk as a varint": (
        _field(3, _field(1, _key(1, 0) + b"\x01")),
        r"data\[0\]\.model_input\[0\]\.encoded_text \(field 1\) came as a varint",
    ),
    "an image chunk": (
        _request(chunk=pb.Chunk(image=pb.ImageChunk(data=b"\x89PNG", format="png"))),
        r"data\[0\]\.model_input\[0\] is an image chunk; MinT trains text models",
    ),
    "an audio chunk": (
        _request(chunk=pb.Chunk(dmel=pb.DmelChunk(dmel=b"x"))),
        r"is an audio \(dmel\) chunk",
    ),
    "token bytes not whole int32s": (
        _request(chunk=pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=b"\1\0\0"))),
        "3 token bytes are not whole int32s",
    ),
    "a sparse tensor": (
        _request(inputs={"weights": pb.Tensor(sparse_csr=pb.SparseCsr(values=b"\0" * 4))}),
        r"loss_fn_inputs\['weights'\] is a sparse tensor",
    ),
    "a bfloat16 tensor": (
        _request(inputs={"weights": _tensor(dtype=pb.DTYPE_BFLOAT16)}),
        "has dtype DTYPE_BFLOAT16; expected float32 or int64",
    ),
    "an unknown dtype": (_request(inputs={"w": _tensor(dtype=9)}), "has dtype 9"),
    "no dtype": (_request(inputs={"w": _tensor(dtype=0)}), "has dtype DTYPE_UNSPECIFIED"),
    "data shorter than the shape": (
        _request(inputs={"w": _tensor(shape=[2])}),
        r"has shape \[2\] of int64 \(16 bytes\) but 8 bytes of data",
    ),
    "data longer than the shape": (
        _request(inputs={"w": _tensor(shape=[2], dtype=pb.DTYPE_FLOAT32, dense=b"\0" * 12)}),
        r"shape \[2\] of float32 \(8 bytes\) but 12 bytes",
    ),
    "a negative dimension": (
        _request(inputs={"w": _tensor(shape=[-1, -1])}),
        "a negative dimension",
    ),
    "bytes not whole values": (
        _request(inputs={"w": _tensor(dense=b"\0" * 6)}),
        "6 bytes are not whole int64s",
    ),
    "a tensor's dtype as bytes": (
        _field(3, _field(2, _field(1, b"w") + _field(2, _field(1, b"") + _field(3, b"\1")))),
        r"data\[0\]\.loss_fn_inputs\['w'\]\.dtype \(field 3\) came as length-delimited",
    ),
    "too many datums": (
        pb.ForwardBackwardRequest(data=[pb.Datum()] * 1025).SerializeToString(),
        "carries 1025 datums; one call takes at most 1024",
    ),
    "too many chunks": (
        _field(3, b"".join(_field(1, _field(1, b"")) for _ in range(100))) * 200,
        "carries 20000 model_input chunks; one call takes at most 16384 tokens",
    ),
    "too many loss inputs": (
        _request(inputs={str(n): _tensor() for n in range(9)}),
        r"data\[0\]\.loss_fn_inputs has 9 tensors; a datum takes at most 8",
    ),
    "a text loss config": (
        _request(loss_fn_config_v2={"clip": pb.LossConfigValue(text="high")}),
        r"loss_fn_config\['clip'\] is text",
    ),
}


@pytest.mark.parametrize("body,match", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_bodies_are_wire_errors_naming_the_fault(body: bytes, match: str) -> None:
    with pytest.raises(wire.WireError, match=match):
        wire.decode_forward_backward(body)


def _decodes_or_refuses(body: bytes) -> None:
    try:
        wire.decode_forward_backward(body)
    except wire.WireError as e:
        assert str(e)  # a message, whatever the bytes


SAMPLE = _body([_datum(3), _datum(2, logprobs=[-0.5, -1.0])], "importance_sampling")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_random_bytes_only_ever_raise_wire_error(body: bytes) -> None:
    _decodes_or_refuses(body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(["flip", "cut", "insert", "drop"]),
            st.integers(0, len(SAMPLE) - 1),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_mutated_sdk_bodies_only_ever_raise_wire_error(edits) -> None:
    body = bytearray(SAMPLE)
    for kind, at, byte in edits:
        at %= max(len(body), 1)
        if kind == "flip":
            body[at : at + 1] = bytes([byte])
        elif kind == "cut":
            del body[at:]
        elif kind == "insert":
            body[at:at] = bytes([byte])
        else:
            del body[at : at + 1]
    _decodes_or_refuses(bytes(body))


def test_the_sdks_largest_chunks_fit_the_body_limit() -> None:
    # the most datums one call takes, filling the SDK's chunk budget (16 bytes per position)
    per_datum = MAX_STEP_TOKENS // MAX_STEP_DATUMS
    many = _body([_datum(per_datum) for _ in range(MAX_STEP_DATUMS)])
    # one datum of the most positions a call takes, with ppo's inputs on top
    n = MAX_STEP_TOKENS
    ppo = _datum(n, logprobs=[-1.0] * n, advantages=[0.5] * n)
    one = _body([ppo], "ppo")
    assert max(len(many), len(one)) < router.MAX_FWDBWD_BODY_BYTES // 2
    assert len(wire.decode_forward_backward(many).data) == MAX_STEP_DATUMS


@pytest.fixture
def served():
    catalog, trainer = FakeCatalog(), FakeTrainer()
    gw = Gateway(GatewayConfig(instance_id="gw-tk", port=0), catalog, FakeEngines())
    gw.tinker = TinkerApi(gw, trainer, [BASE], futures=FuturesTable(poll_s=0.5))
    server = ThreadedServer(gw).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            yield client, {"X-API-Key": f"tml-{catalog.add_key('acme')}"} | PROTO
    finally:
        server.stop()


def test_forward_backward_bodies_past_the_limit_are_413s(served) -> None:
    client, headers = served
    big = b"\0" * (router.MAX_FWDBWD_BODY_BYTES + 1)
    got = client.post("/api/v1/forward_backward", content=big, headers=headers)
    assert got.status_code == 413
    error = got.json()["error"]
    assert error["code"] == "request_too_large" and error["param"] == "data"
    assert str(router.MAX_FWDBWD_BODY_BYTES) in error["message"]
    assert "256 KiB" in error["message"]

    def chunks():  # no content-length: refused once the stream passes the limit
        for _ in range(router.MAX_FWDBWD_BODY_BYTES // 65536 + 1):
            yield b"\0" * 65536

    got = client.post("/api/v1/forward_backward", content=chunks(), headers=headers)
    assert got.status_code == 413 and got.json()["error"]["code"] == "request_too_large"


def test_malformed_bodies_are_400s_naming_the_field(served) -> None:
    client, headers = served
    for body, match in [
        (_key(2, 2) + b"\x017", "seq_id (field 2) came as length-delimited"),
        (_key(1, 2) + b"\x02\xff\xfe", "bad UTF-8"),
        (VALID[:-3], "not a protobuf ForwardBackwardRequest"),
    ]:
        got = client.post("/api/v1/forward_backward", content=body, headers=headers)
        assert got.status_code == 400, got.text
        assert match in got.json()["error"]["message"]


def test_forward_backward_decodes_off_the_event_loop(served, monkeypatch) -> None:
    client, headers = served
    on_loop: list[bool] = []

    def decode(body: bytes) -> wire.FwdBwdRequest:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return wire.decode_forward_backward(body)

    monkeypatch.setattr(router, "decode_forward_backward", decode)
    got = client.post("/api/v1/forward_backward", content=_key(2, 2) + b"\x017", headers=headers)
    assert got.status_code == 400 and on_loop == [False]


def test_double_fields_keep_their_bits() -> None:
    # loss_fn_config travels as fixed64 doubles: what the SDK meant is what the step gets
    body = _body([_datum(1)], "ppo", config={"clip_low_threshold": 0.1})
    assert struct.pack("<d", 0.1) in body
    assert wire.decode_forward_backward(body).loss_fn_config == {"clip_low_threshold": 0.1}

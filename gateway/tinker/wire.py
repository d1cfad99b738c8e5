"""The Tinker SDK's protobuf messages, read and written by hand (no generated code, no runtime
dependency on the SDK): ``forward_backward`` bodies come in as ``ForwardBackwardRequest``, and the
SDK only accepts ``ForwardBackwardOutput`` and ``SampleResponse`` results as protobuf.

Field numbers follow ``tinker/proto/tinker_public.proto`` of SDK 0.38.0 (tests/unit checks them
against the SDK's own descriptor). Only what MinT serves is decoded: text chunks and dense
tensors; an image or audio chunk, a sparse tensor or a malformed body is a :class:`WireError`
naming what it met.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# Wire types.
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
# tinker_public.DType
DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<i8"), 3: np.dtype("<i4")}
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
STOP_REASONS = {"stop": 0, "length": 1}  # tinker_public.StopReason


class WireError(ValueError):
    """A protobuf body this API cannot read: the message says what was wrong."""


Fields = dict[int, list[int | bytes]]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated protobuf varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("protobuf varint longer than 10 bytes")


def parse(buf: bytes) -> Fields:
    """One message's fields: number → values in order (ints for varints, bytes otherwise)."""
    out: Fields = {}
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == VARINT:
            value, pos = _varint(buf, pos)
        elif kind == LEN:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError(f"protobuf field {number} runs past the end of the body")
            value, pos = buf[pos : pos + size], pos + size
        elif kind in (FIXED64, FIXED32):
            width = 8 if kind == FIXED64 else 4
            if pos + width > len(buf):
                raise WireError(f"protobuf field {number} runs past the end of the body")
            value, pos = buf[pos : pos + width], pos + width
        else:
            raise WireError(f"protobuf wire type {kind} (field {number}) is not supported")
        out.setdefault(number, []).append(value)
    return out


def _last(fields: Fields, number: int, default: int | bytes) -> int | bytes:
    values = fields.get(number)
    return values[-1] if values else default


def _text(fields: Fields, number: int) -> str:
    raw = _last(fields, number, b"")
    if not isinstance(raw, bytes):
        raise WireError(f"protobuf field {number} should be a string")
    return raw.decode("utf-8", errors="strict")


def _map(fields: Fields, number: int) -> list[tuple[str, Fields]]:
    """A ``map<string, V>`` field: (key, the entry's fields) pairs."""
    entries = []
    for raw in fields.get(number, []):
        if not isinstance(raw, bytes):
            raise WireError(f"protobuf map field {number} should be length-delimited")
        entry = parse(raw)
        entries.append((_text(entry, 1), entry))
    return entries


def _double(raw: int | bytes) -> float:
    if not isinstance(raw, bytes) or len(raw) != 8:
        raise WireError("expected a protobuf double")
    return struct.unpack("<d", raw)[0]


def tensor(raw: bytes, name: str) -> np.ndarray:
    """A dense ``Tensor`` as a flat array (float32 values as float, ints as int64)."""
    msg = parse(raw)
    if 2 in msg:
        raise WireError(
            f"loss_fn_inputs[{name!r}] is a sparse tensor; MinT takes dense per-position "
            "tensors: send it dense (a list or a 1-D array)"
        )
    dtype = _last(msg, 3, 0)
    if dtype not in DTYPES:
        raise WireError(f"loss_fn_inputs[{name!r}] has dtype {dtype}; expected float32 or int64")
    data = _last(msg, 1, b"")
    assert isinstance(data, bytes)
    if len(data) % DTYPES[dtype].itemsize:
        raise WireError(f"loss_fn_inputs[{name!r}]: its bytes are not whole {DTYPES[dtype]}s")
    return np.frombuffer(data, dtype=DTYPES[dtype])


@dataclass
class WireDatum:
    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class FwdBwdRequest:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float]
    forward_only: bool
    data: list[WireDatum]


def _chunk_tokens(raw: bytes, i: int) -> list[int]:
    chunk = parse(raw)
    if 1 not in chunk:
        kind = "image" if 2 in chunk else "audio (dmel)" if 3 in chunk else "empty"
        raise WireError(
            f"data[{i}].model_input has an {kind} chunk; MinT trains text models: send "
            "EncodedTextChunk token ids only"
        )
    text = parse(chunk[1][-1])  # type: ignore[arg-type]
    packed = _last(text, 1, b"")
    assert isinstance(packed, bytes)
    if len(packed) % 4:
        raise WireError(f"data[{i}].model_input: token bytes are not whole int32s")
    return np.frombuffer(packed, dtype="<i4").tolist()


def decode_forward_backward(body: bytes) -> FwdBwdRequest:
    msg = parse(body)
    config: dict[str, float] = {}
    for key, entry in _map(msg, 5):
        config[key] = _double(_last(entry, 2, b""))
    for key, entry in _map(msg, 7):  # v2: numbers or strings; a string has no MinT meaning
        value = parse(_last(entry, 2, b""))  # type: ignore[arg-type]
        if 2 in value:
            raise WireError(f"loss_fn_config[{key!r}] is text; MinT's losses take numbers only")
        if 1 in value:
            config[key] = _double(value[1][-1])
    data = []
    for i, raw in enumerate(msg.get(3, [])):
        datum = parse(raw)  # type: ignore[arg-type]
        tokens = [t for chunk in datum.get(1, []) for t in _chunk_tokens(chunk, i)]  # type: ignore[arg-type]
        inputs = {name: tensor(_last(e, 2, b""), name) for name, e in _map(datum, 2)}  # type: ignore[arg-type]
        data.append(WireDatum(tokens, inputs))
    seq = _last(msg, 2, 0)
    return FwdBwdRequest(
        model_id=_text(msg, 1),
        seq_id=int(seq),  # type: ignore[arg-type]
        loss_fn=_text(msg, 4),
        loss_fn_config=config,
        forward_only=bool(_last(msg, 6, 0)),
        data=data,
    )


# ---------------------------------------------------------------------------- writing


def _put_varint(out: bytearray, value: int) -> None:
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64s take ten bytes, as protobuf writes them
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _put_key(out: bytearray, number: int, kind: int) -> None:
    _put_varint(out, (number << 3) | kind)


def _put_bytes(out: bytearray, number: int, data: bytes) -> None:
    _put_key(out, number, LEN)
    _put_varint(out, len(data))
    out += data


def _put_int(out: bytearray, number: int, value: int) -> None:
    if value:
        _put_key(out, number, VARINT)
        _put_varint(out, value)


def _put_double(out: bytearray, number: int, value: float) -> None:
    _put_key(out, number, FIXED64)
    out += struct.pack("<d", value)


def _batched(per_datum: list[list[float]]) -> bytes:
    """A float32 ``BatchedTensor``: the datums' values back to back, byte offsets around them."""
    arrays = [np.asarray(values, dtype="<f4") for values in per_datum]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype="<i8")
    out = bytearray()
    _put_bytes(out, 1, b"".join(a.tobytes() for a in arrays))
    _put_bytes(out, 2, offsets.tobytes())
    _put_int(out, 3, DTYPE_FLOAT32)
    return bytes(out)


def encode_forward_backward_output(logprobs: list[list[float]], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: one ArrayRecord with per-datum ``logprobs``, and metrics."""
    record = bytearray()
    _put_bytes(record, 1, b"ArrayRecord")
    entry = bytearray()
    _put_bytes(entry, 1, b"logprobs")
    _put_bytes(entry, 2, _batched(logprobs))
    _put_bytes(record, 2, bytes(entry))
    _put_int(record, 3, len(logprobs))
    out = bytearray()
    _put_bytes(out, 1, b"ArrayRecord")
    _put_bytes(out, 2, bytes(record))
    for name, value in metrics.items():
        item = bytearray()
        _put_bytes(item, 1, name.encode())
        _put_double(item, 2, value)
        _put_bytes(out, 3, bytes(item))
    return bytes(out)


@dataclass(frozen=True)
class WireSequence:
    stop_reason: str  # "stop" | "length"
    tokens: list[int]
    logprobs: list[float] | None


def encode_sample_response(sequences: list[WireSequence]) -> bytes:
    """A ``SampleResponse`` with one ``SampledSequence`` per sample (tokens and logprobs)."""
    out = bytearray()
    for seq in sequences:
        item = bytearray()
        _put_int(item, 1, STOP_REASONS[seq.stop_reason])
        _put_bytes(item, 2, np.asarray(seq.tokens, dtype="<i4").tobytes())
        if seq.logprobs is not None:
            _put_bytes(item, 3, np.asarray(seq.logprobs, dtype="<f4").tobytes())
        _put_bytes(out, 1, bytes(item))
    return bytes(out)

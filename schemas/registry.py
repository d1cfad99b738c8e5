"""Event type registry and the bytes <-> envelope codec.

``EVENT_TYPES`` maps each type string to its current payload model; ``PAYLOADS`` maps every
supported ``(type, schema_version)``. A new incompatible version gets a new class (``…V2``) added
to ``_ALL``; old versions stay decodable while any producer may still send them.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from schemas.envelope import Envelope, Payload, validation_message
from schemas.events import (
    AdapterEvicted,
    AdapterLoaded,
    AliasMoved,
    CanaryCommand,
    CanaryEnded,
    CanaryStarted,
    EvalCompleted,
    EvalRequested,
    ExportCompleted,
    FeedbackSubmitted,
    InferCancel,
    InferCompleted,
    InferDelta,
    InferFailed,
    InferRequested,
    LoadFailed,
    LoadRequested,
    PolicyConfigured,
    PolicyRetirement,
    PromoteCommand,
    RetireCommand,
    RevisionTagged,
    RollbackCommand,
    RolloutCompleted,
    RolloutRequested,
    ServingRefused,
    TagCommand,
    TrainStepCompleted,
    TrainStepFailed,
    TrainStepRequested,
    UpdateCompleted,
    UpdateRequested,
)
from schemas.exceptions import (
    EventDecodeError,
    EventValidationError,
    UnknownEventType,
    UnsupportedSchemaVersion,
)

_ALL: tuple[type[Payload], ...] = (
    RolloutRequested,
    RolloutCompleted,
    UpdateRequested,
    UpdateCompleted,
    ExportCompleted,
    EvalRequested,
    EvalCompleted,
    PromoteCommand,
    RollbackCommand,
    AliasMoved,
    ServingRefused,
    PolicyRetirement,
    CanaryCommand,
    CanaryStarted,
    CanaryEnded,
    FeedbackSubmitted,
    RetireCommand,
    TagCommand,
    RevisionTagged,
    LoadRequested,
    AdapterLoaded,
    AdapterEvicted,
    LoadFailed,
    InferRequested,
    InferCompleted,
    InferFailed,
    InferDelta,
    InferCancel,
    PolicyConfigured,
    TrainStepRequested,
    TrainStepCompleted,
    TrainStepFailed,
)

PAYLOADS: dict[tuple[str, int], type[Payload]] = {(p.event_type, p.schema_version): p for p in _ALL}
EVENT_TYPES: dict[str, type[Payload]] = {}
for _p in sorted(_ALL, key=lambda p: p.schema_version):
    EVENT_TYPES[_p.event_type] = _p  # the highest version wins

# Registry topic name (see streams.topics) for each event type.
TOPIC_OF_TYPE: dict[str, str] = {t: p.topic for t, p in EVENT_TYPES.items()}


def payload_model(event_type: str, schema_version: int) -> type[Payload]:
    """The payload class for a type and version, or a clear error saying what is supported."""
    if event_type not in EVENT_TYPES:
        raise UnknownEventType(
            f"type {event_type!r} is not a MinT event type; known: {', '.join(sorted(EVENT_TYPES))}"
        )
    try:
        return PAYLOADS[(event_type, schema_version)]
    except KeyError:
        versions = sorted(v for t, v in PAYLOADS if t == event_type)
        raise UnsupportedSchemaVersion(
            f"{event_type!r} schema_version {schema_version!r} is not supported by this build "
            f"(supported: {versions}); upgrade the consumer or re-send with a supported version"
        ) from None


def envelope_model(event_type: str, schema_version: int) -> type[Envelope[Any]]:
    return Envelope[payload_model(event_type, schema_version)]  # type: ignore[misc]


def decode_event(data: bytes | str | None) -> Envelope[Any]:
    """Bytes from Kafka → a validated envelope with its typed payload.

    Raises EventDecodeError (not UTF-8 JSON of an object), UnknownEventType,
    UnsupportedSchemaVersion, or EventValidationError (a field is wrong); all are SchemaError
    (a ValueError) and carry ``.reason`` for dead-letter headers.
    """
    if data is None:
        raise EventDecodeError("record value is empty (a tombstone?); expected a JSON event")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EventDecodeError(
            f"record value is not UTF-8 JSON ({e}); first bytes: {bytes(data[:40])!r}"
            if isinstance(data, bytes | bytearray)
            else f"record value is not JSON ({e})"
        ) from e
    if not isinstance(obj, dict):
        raise EventDecodeError(f"event must be a JSON object, got {type(obj).__name__}")
    return validate_event(obj)


def validate_event(obj: dict[str, Any]) -> Envelope[Any]:
    """A decoded JSON object → a validated envelope (same errors as decode_event)."""
    event_type, version = obj.get("type"), obj.get("schema_version")
    if not isinstance(event_type, str):
        raise EventValidationError(f"field 'type' must be a string event type, got {event_type!r}")
    if not isinstance(version, int) or isinstance(version, bool):
        raise EventValidationError(
            f"field 'schema_version' of {event_type!r} must be an integer, got {version!r}"
        )
    model = envelope_model(event_type, version)
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise EventValidationError(
            validation_message(e, f"invalid {event_type} v{version} event")
            + f" (contract: schemas/json/{event_type}.v{version}.json)"
        ) from e


def encode_event(envelope: Envelope[Any]) -> bytes:
    """Envelope → UTF-8 JSON bytes (the wire format; ``decode_event`` reverses it)."""
    if type(envelope.payload) is Payload:
        raise EventValidationError("envelope has an untyped payload; build it with make_event()")
    return envelope.model_dump_json().encode()

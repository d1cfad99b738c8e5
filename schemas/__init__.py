"""Wire contracts and configuration: the bottom layer, importing nothing else of MinT.

Build an event with ``make_event(payload, tenant=…, policy=…, producer=…, caused_by=…)``, put it
on the wire with ``encode_event``, read it back with ``decode_event``.
"""

from schemas.envelope import Command, Envelope, Payload, make_event
from schemas.exceptions import (
    EventDecodeError,
    EventValidationError,
    MintError,
    SchemaError,
    UnknownEventType,
    UnsupportedSchemaVersion,
)
from schemas.names import in_namespace, policy_id, split_policy_id
from schemas.registry import (
    EVENT_TYPES,
    PAYLOADS,
    TOPIC_OF_TYPE,
    decode_event,
    encode_event,
    payload_model,
    validate_event,
)
from schemas.settings import MintSettings, get_settings

__all__ = [
    "EVENT_TYPES",
    "PAYLOADS",
    "TOPIC_OF_TYPE",
    "Command",
    "Envelope",
    "EventDecodeError",
    "EventValidationError",
    "MintError",
    "MintSettings",
    "Payload",
    "SchemaError",
    "UnknownEventType",
    "UnsupportedSchemaVersion",
    "decode_event",
    "encode_event",
    "get_settings",
    "in_namespace",
    "make_event",
    "payload_model",
    "policy_id",
    "split_policy_id",
    "validate_event",
]

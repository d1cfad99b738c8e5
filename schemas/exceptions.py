"""Errors of the wire contracts. Each carries a short ``reason`` that dead-letter headers reuse."""

from __future__ import annotations


class SchemaError(ValueError):
    """Base error: bytes or fields that do not form a valid MinT event."""

    reason = "invalid"


class EventDecodeError(SchemaError):
    """The bytes are not UTF-8 JSON of an object (nothing to validate)."""

    reason = "undecodable"


class EventValidationError(SchemaError):
    """The JSON is an event of a known type and version, but a field is wrong."""

    reason = "invalid"


class UnknownEventType(SchemaError, LookupError):
    """The envelope names a ``type`` that this build does not know."""

    reason = "unknown_type"


class UnsupportedSchemaVersion(SchemaError, LookupError):
    """The ``type`` is known but its ``schema_version`` is not (a newer producer?)."""

    reason = "unknown_version"

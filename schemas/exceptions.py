"""Errors of the wire contracts, and ``MintError``, the root of every MinT error.

``MintError`` lives here, in the bottom layer (schemas imports nothing of ours), so that every
layer's root inherits it: ``SchemaError``, ``catalog.CatalogError``, ``streams.StreamsError``,
the workers' roots, the gateway's ``ApiError``, the launcher's ``LauncherError``, and the SDK's
errors (``mint.sdk.MintError`` is this class). Each root also keeps the standard exception it
replaces, so callers that only know ``ValueError`` or ``ConnectionError`` still catch them. Each
schema error carries a short ``reason`` that dead-letter headers reuse.
"""

from __future__ import annotations


class MintError(Exception):
    """Root of every MinT error: ``except MintError`` catches what MinT raises on purpose (the
    CLI turns it into one ``error:`` line), and nothing of Python's or a driver's own."""


class SchemaError(MintError, ValueError):
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

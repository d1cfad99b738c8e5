"""Controller errors: a base and categories that also inherit the stdlib exception they replace."""

from __future__ import annotations


class ControllerError(Exception):
    """Base of every lifecycle-controller error."""


class CommandRefused(ControllerError, RuntimeError):
    """A promote/rollback command could not be carried out (stale CAS, unknown revision)."""

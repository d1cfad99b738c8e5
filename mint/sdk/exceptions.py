"""SDK errors: categories under ``MintError`` that also inherit the stdlib exception they
replace. ``MintError`` is the root of every MinT error (defined in schemas/exceptions.py, the
bottom layer), so ``except MintError`` also catches the catalog's and the streams' errors that
a call passes on."""

from __future__ import annotations

from schemas.exceptions import MintError


class WaitTimeout(MintError, TimeoutError):
    """The event a call waits for did not arrive in time (a worker is down or refused)."""


class RequestFailed(MintError, RuntimeError):
    """A worker answered with an error result (e.g. infer.failed)."""


class CommandRefused(MintError, RuntimeError):
    """The controller refused a command (``serving.refused``: a promote, rollback, canary, tag
    or retirement): the message says why (e.g. the alias is no longer at the expected revision:
    re-read it and retry; no such revision)."""

    def __init__(self, message: str, *, current_revision: int | None = None) -> None:
        super().__init__(message)
        self.current_revision = current_revision


class InvalidSampling(MintError, ValueError):
    """A sampling or structured-output setting the request contract cannot carry (an unknown
    keyword, a value out of range, a schema that is not JSON): nothing was sent."""

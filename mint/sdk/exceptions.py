"""SDK errors: a base and categories that also inherit the stdlib exception they replace."""

from __future__ import annotations


class MintError(Exception):
    """Base of every SDK error."""


class WaitTimeout(MintError, TimeoutError):
    """The event a call waits for did not arrive in time (a worker is down or refused)."""


class RequestFailed(MintError, RuntimeError):
    """A worker answered with an error result (e.g. infer.failed)."""


class CommandRefused(MintError, RuntimeError):
    """The controller refused a promote or rollback (``serving.refused``): the message says why
    (e.g. the alias is no longer at the expected revision: re-read it and retry)."""

    def __init__(self, message: str, *, current_revision: int | None = None) -> None:
        super().__init__(message)
        self.current_revision = current_revision

"""The CLI's one error decorator: an error a person can act on is one line, never a traceback.

``@one_line_errors`` on a command prints what MinT raises on purpose (``MintError``: the catalog,
the streams, the SDK, the workers' and the launcher's errors), an operating-system error (a file,
a socket, a permission) and kafka-python's own errors as ``error: <message>`` on stderr and exits
1. Usage errors stay click's (``click.UsageError``: exit 2, with the command's usage); anything
else is a bug and keeps its traceback. ``@one_line_errors(RuntimeError)`` adds the plain errors
of a library a command calls that has no MinT type of its own.

:func:`quiet_driver_tracebacks` keeps the Cassandra driver's own tracebacks off a person's terminal:
what the driver logs and then raises (a refused prepare, a connect that found no node) reaches the
command as the error it raises, which MinT words with its fix.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.markup import escape

F = TypeVar("F", bound=Callable[..., Any])

console = Console(stderr=True)
_CLICK = (click.ClickException, click.exceptions.Exit, click.exceptions.Abort)


def _expected(also: tuple[type[BaseException], ...]) -> tuple[type[BaseException], ...]:
    # Imported when an error arrives, not at every command's start (kafka's import is not free).
    from kafka.errors import KafkaError

    from schemas.exceptions import MintError

    return (MintError, OSError, KafkaError, *also)


def fail(message: object) -> NoReturn:
    """Print ``error: <message>`` on stderr (one line, whatever the terminal's width); exit 1."""
    console.print(f"[red]error:[/red] {escape(str(message))}", soft_wrap=True)
    sys.exit(1)


def _wrap(fn: F, also: tuple[type[BaseException], ...]) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            # click's own (usage errors: exit 2; Exit and Abort are RuntimeErrors) stay click's.
            if isinstance(e, _CLICK) or not isinstance(e, _expected(also)):
                raise
            fail(e)

    wrapper.one_line_errors = also  # type: ignore[attr-defined]  # the tests find wrapped commands by it
    return wrapper  # type: ignore[return-value]


def one_line_errors(*args: Any) -> Any:
    """``@one_line_errors`` or ``@one_line_errors(ExtraError, …)`` on a click command."""
    if len(args) == 1 and callable(args[0]) and not isinstance(args[0], type):
        return _wrap(args[0], ())
    return lambda fn: _wrap(fn, args)


# What the Cassandra driver logs with a traceback and then raises to its caller: the command's own
# `error: …` line says it (with the fix), so the log record only repeats it, traceback first.
_DRIVER_RAISES = (
    "Error preparing query:",
    "Control connection failed to connect, shutting down Cluster:",
)
# The driver's modules that log with a traceback (log.exception or exc_info=True).
_DRIVER_LOGGERS = (
    "cassandra.cluster",
    "cassandra.connection",
    "cassandra.pool",
    "cassandra.metadata",
)


class _DriverTracebacks(logging.Filter):
    """Drop a Cassandra driver record the driver raises to its caller anyway; fold any other
    record's traceback into its line (``<message> <Type>: <text>``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in _DRIVER_RAISES:
            return False
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()} {type(error).__name__}: {error}"
            record.args = ()
            record.exc_info = record.exc_text = None
        return True


def quiet_driver_tracebacks() -> None:
    """Install :class:`_DriverTracebacks` on the driver's loggers (idempotent). The CLI calls it
    unless MINT_LOG_LEVEL=DEBUG, which keeps every traceback for whoever is chasing a driver bug."""
    for name in _DRIVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DriverTracebacks) for f in logger.filters):
            logger.addFilter(_DriverTracebacks())

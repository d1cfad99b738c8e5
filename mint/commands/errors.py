"""The CLI's one error decorator: an error a person can act on is one line, never a traceback.

``@one_line_errors`` on a command prints what MinT raises on purpose (``MintError``: the catalog,
the streams, the SDK, the workers' and the launcher's errors), an operating-system error (a file,
a socket, a permission) and kafka-python's own errors as ``error: <message>`` on stderr and exits
1. Usage errors stay click's (``click.UsageError``: exit 2, with the command's usage); anything
else is a bug and keeps its traceback. ``@one_line_errors(RuntimeError)`` adds the plain errors
of a library a command calls that has no MinT type of its own.
"""

from __future__ import annotations

import functools
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

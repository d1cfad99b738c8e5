"""The SDK client of the CLI's one-shot commands (one definition for every command module), and
how a command that publishes words the ways sending can fail."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from schemas.settings import get_settings

if TYPE_CHECKING:
    from mint.sdk import MintClient


def cli_client(tenant: str, timeout_s: float = 60.0, producer: str = "cli") -> MintClient:
    """A MintClient for one command. With no broker listening at the bootstrap addresses it
    fails at once: a one-shot command has nothing to wait for, while kafka-python would retry
    for its 30 s bootstrap timeout (which workers keep: they outlast a broker's restart)."""
    from mint.sdk import MintClient
    from streams.clients import require_broker

    settings = get_settings()
    require_broker(settings)
    return MintClient(settings, tenant, producer=producer, timeout_s=timeout_s)


@contextmanager
def sending(unsent: str, unsure: str, late: str | None = None) -> Iterator[None]:
    """Around publishing a command (and waiting for its answer): each way it fails as a
    MintError that tells a person whether to send it again. ``unsent`` follows a broker that
    was away (nothing was sent), ``unsure`` a publish that failed midway (it may have been
    sent), ``late`` an answer that did not come in time (None: the WaitTimeout as it is)."""
    # Imported when a command sends, not at every command's start (kafka's import is not free).
    from mint.sdk.exceptions import WaitTimeout
    from schemas.exceptions import MintError
    from streams.exceptions import KafkaUnavailable, PublishError

    try:
        yield
    except KafkaUnavailable as e:
        raise MintError(f"{e}; {unsent}") from None
    except PublishError as e:
        raise MintError(f"{e}; {unsure}") from None
    except WaitTimeout as e:
        if late is None:
            raise
        raise MintError(f"{e} {late}") from None


def carried_out_later(check: str) -> str:
    """What ``sending`` says of a command the controller has not answered yet: it stays on
    serving.commands, and ``check`` (a command line) shows when it was carried out."""
    return (
        "The command is on serving.commands: the controller carries it out when it runs "
        f"(`mint worker controller`); `{check}` shows when"
    )

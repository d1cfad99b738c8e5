"""The SDK client of the CLI's one-shot commands (one definition for every command module)."""

from __future__ import annotations

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

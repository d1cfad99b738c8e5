"""The commands' Cassandra session: connected for one command, shut down after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from schemas.settings import MintSettings


@contextmanager
def catalog_session(settings: MintSettings) -> Iterator[Any]:
    from catalog.cluster import connect  # the driver's import is not free: only when used

    cluster, session = connect(settings)
    try:
        yield session
    finally:
        cluster.shutdown()

"""A processor for the replay tests: ``factory(settings)`` returns a handler recording events."""

from __future__ import annotations

SEEN: list[str] = []


def factory(settings):
    def handle(envelope, record) -> None:
        SEEN.append(str(envelope.event_id))

    return handle

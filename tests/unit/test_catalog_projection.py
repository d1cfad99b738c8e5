"""Projection dispatch without Cassandra: a fake repository records what would be written."""

from __future__ import annotations

import uuid

import pytest

from catalog.projection import PROJECTED_TYPES, Outcome, apply_event
from schemas import EVENT_TYPES, make_event
from schemas.examples import example_payload


class FakeRepo:
    def __init__(self, applied: set[uuid.UUID] | None = None) -> None:
        self.applied = applied or set()
        self.calls: list[str] = []

    def is_applied(self, event_id):
        return event_id in self.applied

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append(name)
            raise AssertionError(f"unexpected write {name}")

        return record


def _event(event_type: str):
    return make_event(example_payload(event_type), tenant="acme", policy="math-rl",
                      producer="test")  # fmt: skip


@pytest.mark.parametrize("event_type", sorted(set(EVENT_TYPES) - set(PROJECTED_TYPES)))
def test_other_event_types_are_ignored_without_reads_or_writes(event_type):
    repo = FakeRepo()
    assert apply_event(repo, _event(event_type)) is Outcome.IGNORED
    assert repo.calls == []


@pytest.mark.parametrize("event_type", PROJECTED_TYPES)
def test_seen_events_are_duplicates_without_writes(event_type):
    env = _event(event_type)
    repo = FakeRepo({env.event_id})
    assert apply_event(repo, env) is Outcome.DUPLICATE
    assert repo.calls == []

"""Projection dispatch without Cassandra: a fake repository records what would be written."""

from __future__ import annotations

import uuid

import pytest

from catalog.exceptions import Conflict
from catalog.models import Revision
from catalog.projection import PROJECTED_TYPES, Outcome, apply_event, apply_events
from schemas import EVENT_TYPES, make_event
from schemas.events import ExportCompleted
from schemas.examples import example_fields, example_payload


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
    return make_event(example_payload(event_type), tenant="acme", policy="math-rl", producer="test")


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


class RunRepo:
    """Records the calls ``apply_events`` makes; registers every run it is given."""

    def __init__(self, applied=(), refuse: int | None = None) -> None:
        self.applied, self.refuse, self.calls = set(applied), refuse, []

    def applied_among(self, ids):
        self.calls.append(("applied_among", len(ids)))
        return {i for i in ids if i in self.applied}

    def register_revisions(self, tenant, policy, regs):
        self.calls.append(("register", [r.revision for r in regs]))
        if self.refuse in [r.revision for r in regs]:
            raise Conflict(f"revision {self.refuse} refused")
        return [
            Revision(
                tenant,
                policy,
                r.revision,
                r.digest,
                r.store_uri,
                "m",
                None,
                r.at,
                r.by,
                r.source_event_id,
            )
            for r in regs
        ]

    def get_revision(self, tenant, policy, n):
        return Revision(
            tenant,
            policy,
            n,
            example_payload("alias.moved").adapter_digest,
            "u",
            "m",
            None,
            None,
            "",
            None,
        )

    def move_alias(self, *args, **kwargs):
        self.calls.append(("move", kwargs["event_id"]))

    def record_applied_many(self, rows):
        self.calls.append(("record", [r[4] for r in rows]))


def _export(n: int, policy: str = "math-rl"):
    fields = {
        **example_fields("export.completed", "acme", policy),
        "revision": n,
        "adapter_digest": f"sha256:{n:064x}",
    }
    return make_event(ExportCompleted(**fields), tenant="acme", policy=policy, producer="test")


def test_a_run_registers_consecutive_exports_together_and_records_once():
    exports = [_export(n) for n in (1, 2, 3)]
    moved = _event("alias.moved")
    other = _event("update.requested")
    later = [_export(n) for n in (4, 5)]
    run = [*exports, exports[1], moved, other, *later]  # exports[1] redelivered within the poll
    repo = RunRepo(applied={later[1].event_id})  # applied before this poll
    outcomes = apply_events(repo, run)
    assert [o.value for o in outcomes] == ["applied"] * 3 + [
        "duplicate",
        "applied",
        "ignored",
        "applied",
        "duplicate",
    ]
    assert repo.calls == [
        ("applied_among", 7),  # one read for the run (the ignored event is not looked up)
        ("register", [1, 2, 3]),  # one call: one lightweight transaction
        ("move", moved.event_id),
        ("register", [4]),
        ("record", [1, 2, 3, 1, 4]),  # one write at the end, the move's target among them
    ]


def test_a_refused_event_leaves_the_run_unrecorded_for_one_by_one():
    repo = RunRepo(refuse=3)
    with pytest.raises(Conflict, match="revision 3 refused"):
        apply_events(repo, [_export(n) for n in (1, 2, 3)])
    assert [c[0] for c in repo.calls] == ["applied_among", "register"]  # nothing recorded

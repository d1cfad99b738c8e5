"""The catalog as a projection of the event log: apply one event envelope, idempotently.

At-least-once delivery is safe twice over: ``applied_events`` skips an event seen before, and each
write is itself idempotent (a revision by digest and source event id, an alias move by event id),
so a crash between the write and the ``applied_events`` row repeats nothing. Every timestamp comes
from the event (``occurred_at``), never the wall clock, so replaying the log into an empty
keyspace yields the same rows as the live catalog.

``export.completed`` registers a revision (creating the policy on its first export) with its
training figures; ``alias.moved`` records the move; ``eval.completed`` records the revision's
result on its suite (refused for an unknown revision or another digest); ``policy.retired``
sets or clears the policy's ``retired_at``/``retired_by`` (refused for an unknown policy).
Other types are ignored. ``apply_events`` applies one policy's run of events at once (the
projector's poll): consecutive exports in one lightweight transaction. Promote and rollback
*commands* are executed by :func:`execute_serving_command`, which returns the ``alias.moved``
fact to publish.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import structlog

from catalog.exceptions import AliasConflict, AliasNotFound, Conflict, PolicyNotFound
from catalog.models import AliasMove, Registration, Revision, revision_metadata
from catalog.refs import Ref
from catalog.repository import CatalogRepository
from schemas import Envelope
from schemas.envelope import make_reply
from schemas.events import (
    AliasMoved,
    CanaryEnded,
    CanaryStarted,
    EvalCompleted,
    ExportCompleted,
    PolicyRetirement,
    PromoteCommand,
    RevisionTagged,
    RollbackCommand,
)

log = structlog.get_logger()

PROJECTED_TYPES = (
    ExportCompleted.event_type,
    AliasMoved.event_type,
    EvalCompleted.event_type,
    PolicyRetirement.event_type,
    CanaryStarted.event_type,
    CanaryEnded.event_type,
    RevisionTagged.event_type,
)
# AliasMoved ids derive from their command's id, so a redelivered command re-emits the same fact.
_MOVE_NS = uuid.UUID("5b0f2a9e-3c1d-4e7a-9f1b-6d2c8a4e0b17")


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # seen before: nothing written
    IGNORED = "ignored"  # not a catalog event


def apply_event(repo: CatalogRepository, env: Envelope[Any], *, routes: bool = False) -> Outcome:
    """Apply one event to the catalog. Raises a CatalogError (a Conflict, NotFound, …) when the
    event contradicts the catalog; the consumer dead-letters it with that message. ``routes``:
    a rebuild, which also sets and clears canary routes (``replay_canary_route``)."""
    if env.type not in PROJECTED_TYPES:
        return Outcome.IGNORED
    if repo.is_applied(env.event_id):
        return Outcome.DUPLICATE
    if isinstance(env.payload, ExportCompleted):
        revision = _apply_exports(repo, [env])[0].revision
    else:
        revision = _apply_one(repo, env, routes)
    repo.record_applied(
        env.event_id, env.type, env.tenant, env.policy, revision=revision, at=env.occurred_at
    )
    return Outcome.APPLIED


def apply_events(
    repo: CatalogRepository, envs: Sequence[Envelope[Any]], *, routes: bool = False
) -> list[Outcome]:
    """Apply one policy's run of events in order (what a poll brought for one key), as
    ``apply_event`` applies each: one read of applied_events for the run, each stretch of
    consecutive exports registered together (one lightweight transaction), the applied_events
    rows written at the end. Raises at the first event the catalog refuses, having recorded
    none: what it did before is idempotent, so the caller applies the run one by one."""
    projected = [e.event_id for e in envs if e.type in PROJECTED_TYPES]
    seen = repo.applied_among(projected) if projected else set()
    outcomes: list[Outcome] = []
    applied: list[tuple] = []
    i = 0
    while i < len(envs):
        env = envs[i]
        if env.type not in PROJECTED_TYPES or env.event_id in seen:
            ignored = env.type not in PROJECTED_TYPES
            outcomes.append(Outcome.IGNORED if ignored else Outcome.DUPLICATE)
            i += 1
            continue
        if isinstance(env.payload, ExportCompleted):
            j = i + 1
            while j < len(envs) and _same_run(env, envs[j]) and envs[j].event_id not in seen:
                j += 1
            stretch = _distinct(envs[i:j])
            revisions = [r.revision for r in _apply_exports(repo, stretch)]
        else:
            stretch = [env]
            revisions = [_apply_one(repo, env, routes)]
        for e, revision in zip(stretch, revisions, strict=True):
            seen.add(e.event_id)
            applied.append(
                (e.event_id, e.type, e.tenant, e.policy, revision, "applied", e.occurred_at)
            )
        outcomes += [Outcome.APPLIED] * len(stretch)
        i += len(stretch)
    repo.record_applied_many(applied)
    return outcomes


def _same_run(first: Envelope[Any], env: Envelope[Any]) -> bool:
    return isinstance(env.payload, ExportCompleted) and env.policy_id == first.policy_id


def _distinct(envs: Sequence[Envelope[Any]]) -> list[Envelope[Any]]:
    """The stretch up to the first event seen twice in it (a redelivery within one poll)."""
    ids: set[uuid.UUID] = set()
    for k, env in enumerate(envs):
        if env.event_id in ids:
            return list(envs[:k])
        ids.add(env.event_id)
    return list(envs)


def _apply_exports(repo: CatalogRepository, envs: Sequence[Envelope[Any]]) -> list[Revision]:
    first = envs[0]
    regs = [_registration(env, env.payload) for env in envs]
    try:
        return repo.register_revisions(first.tenant, first.policy, regs)
    except PolicyNotFound:
        # The first export of a policy creates it, so a rebuild from the log creates it too.
        pol = repo.create_policy(
            first.tenant,
            first.policy,
            first.payload.base_model,
            by=first.producer,
            at=first.occurred_at,
        )
        return repo.register_revisions(first.tenant, first.policy, regs, created=pol)


def _registration(env: Envelope[Any], p: ExportCompleted) -> Registration:
    return Registration(
        digest=p.adapter_digest,
        store_uri=p.store_uri,
        base_model=p.base_model,
        parent_revision=p.parent_revision,
        metadata=revision_metadata(p),
        source_event_id=env.event_id,
        revision=p.revision,
        by=env.producer,
        at=env.occurred_at,
        training=p.training.figures() if p.training is not None else {},
    )


def _apply_one(repo: CatalogRepository, env: Envelope[Any], routes: bool) -> int | None:
    """A projected event other than an export; returns the revision it concerns (None: it
    concerns the policy). ``routes``: a rebuild, which sets canary routes from their facts."""
    p = env.payload
    if isinstance(p, AliasMoved):
        return _apply_alias_moved(repo, env, p)
    if isinstance(p, EvalCompleted):
        return _apply_eval_completed(repo, env, p)
    if isinstance(p, PolicyRetirement):
        # The event's time, never the wall clock: a rebuild writes the same retired_at.
        repo.set_retired(
            env.tenant,
            env.policy,
            retired=p.retired,
            at=env.occurred_at,
            by=p.requested_by or env.producer,
        )
        return None
    if isinstance(p, RevisionTagged):
        repo.set_tags(env.tenant, env.policy, p.revision, p.tags, at=env.occurred_at)
        return p.revision
    if isinstance(p, (CanaryStarted, CanaryEnded)):
        if routes:
            repo.replay_canary_route(env)
        repo.record_canary(env)  # the controller wrote the same row when it carried it out
        return p.revision
    raise TypeError(f"{env.type!r} is not projected")  # PROJECTED_TYPES and this disagree


def _apply_eval_completed(repo: CatalogRepository, env: Envelope[Any], p: EvalCompleted) -> int:
    repo.record_evaluation(
        env.tenant,
        env.policy,
        p.revision,
        digest=p.adapter_digest,
        suite=p.suite,
        metrics=p.metrics,
        thresholds={k: t.model_dump(exclude_none=True) for k, t in p.thresholds.items()},
        passed=p.passed,
        failures=p.failures,
        refused=p.refused,
        at=env.occurred_at,
        by=env.producer,
        event_id=env.event_id,
    )
    return p.revision


def _apply_alias_moved(repo: CatalogRepository, env: Envelope[Any], p: AliasMoved) -> int:
    target = repo.get_revision(env.tenant, env.policy, p.to_revision)
    if target.digest != p.adapter_digest:
        raise Conflict(
            f"alias.moved {env.event_id} says {env.policy_id}@{p.to_revision} has digest "
            f"{p.adapter_digest}, the catalog has {target.digest}: the event is wrong or the "
            "catalog was built from another log"
        )
    repo.move_alias(
        env.tenant,
        env.policy,
        p.alias,
        p.to_revision,
        expected=p.from_revision,
        by=p.requested_by or env.producer,
        reason=p.reason,
        event_id=env.event_id,
        at=env.occurred_at,
        kind=p.cause,
        checked=True,
        fact=True,
    )
    return p.to_revision


def execute_serving_command(
    repo: CatalogRepository, cmd: Envelope[Any], *, producer: str
) -> Envelope[AliasMoved]:
    """Carry out a promote or rollback command by compare-and-set and return the ``alias.moved``
    event to publish. Idempotent: a redelivered command returns the same event (same id).

    Raises AliasConflict when ``expected_revision`` is stale (the message names the current one).
    """
    p = cmd.payload
    move_id = uuid.uuid5(_MOVE_NS, str(cmd.event_id))
    by = p.requested_by or cmd.producer
    if isinstance(p, PromoteCommand):
        expected = p.expected_revision
        if expected is None:  # no CAS asked for: move from wherever it is now
            expected = _current(repo, cmd.tenant, cmd.policy, p.alias)
        move = repo.move_alias(
            cmd.tenant,
            cmd.policy,
            p.alias,
            p.revision,
            expected=expected,
            by=by,
            reason=p.reason,
            event_id=move_id,
            at=cmd.occurred_at,
            kind="promote",
            checked=True,
        )
    elif isinstance(p, RollbackCommand):
        cur = repo.get_alias(cmd.tenant, cmd.policy, p.alias)
        if (
            p.expected_revision is not None
            and cur.last_event_id != move_id
            and cur.revision != p.expected_revision
        ):
            raise AliasConflict(
                f"alias {cmd.policy_id}@{p.alias} is at revision {cur.revision}, not the "
                f"expected {p.expected_revision}: re-read it and retry",
                current=cur.revision,
            )
        move = repo.rollback(
            cmd.tenant,
            cmd.policy,
            p.alias,
            to=p.to_revision,
            by=by,
            reason=p.reason or "rollback",
            event_id=move_id,
            at=cmd.occurred_at,
        )
    else:
        raise TypeError(f"{cmd.type!r} is not a serving command (serving.promote/rollback)")
    return make_reply(
        alias_moved(repo, move), cmd, producer=producer, event_id=move_id, occurred_at=move.moved_at
    )


def alias_moved(repo: CatalogRepository, move: AliasMove) -> AliasMoved:
    """The ``alias.moved`` fact of a promote or rollback the catalog carried out (``move``, its
    history row), with the digest and store URI of the revision it moved to."""
    # A Ref of the move's validated names: resolved without checking them again.
    target = repo.resolve(Ref(move.tenant, move.policy, revision=move.to_revision))
    return AliasMoved(
        alias=move.alias,
        from_revision=move.from_revision,
        to_revision=move.to_revision,
        adapter_digest=target.digest,
        store_uri=target.store_uri,
        cause="rollback" if move.kind == "rollback" else "promote",
        reason=move.reason[:1024],
        requested_by=move.moved_by,
        seq=move.seq,
    )


def _current(repo: CatalogRepository, tenant: str, policy: str, alias: str) -> int | None:
    try:
        return repo.get_alias(tenant, policy, alias).revision
    except AliasNotFound:
        return None

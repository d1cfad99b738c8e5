"""The catalog as a projection of the event log: apply one event envelope, idempotently.

At-least-once delivery is safe twice over: ``applied_events`` skips an event seen before, and each
write is itself idempotent (a revision by digest and source event id, an alias move by event id),
so a crash between the write and the ``applied_events`` row repeats nothing. Every timestamp comes
from the event (``occurred_at``), never the wall clock, so replaying the log into an empty
keyspace yields the same rows as the live catalog.

``export.completed`` registers a revision (creating the policy on its first export);
``alias.moved`` records the move. Other types are ignored. Promote and rollback *commands* are
executed by :func:`execute_serving_command`, which returns the ``alias.moved`` fact to publish.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any

import structlog

from catalog.exceptions import AliasConflict, AliasNotFound, Conflict, PolicyNotFound
from catalog.repository import CatalogRepository
from schemas import Envelope, make_event
from schemas.events import AliasMoved, ExportCompleted, PromoteCommand, RollbackCommand

log = structlog.get_logger()

PROJECTED_TYPES = (ExportCompleted.event_type, AliasMoved.event_type)
# AliasMoved ids derive from their command's id, so a redelivered command re-emits the same fact.
_MOVE_NS = uuid.UUID("5b0f2a9e-3c1d-4e7a-9f1b-6d2c8a4e0b17")


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # seen before: nothing written
    IGNORED = "ignored"  # not a catalog event


def apply_event(repo: CatalogRepository, env: Envelope[Any]) -> Outcome:
    """Apply one event to the catalog. Raises a CatalogError (a Conflict, NotFound, …) when the
    event contradicts the catalog; the consumer dead-letters it with that message."""
    if env.type not in PROJECTED_TYPES:
        return Outcome.IGNORED
    if repo.is_applied(env.event_id):
        return Outcome.DUPLICATE
    p = env.payload
    revision = None
    if isinstance(p, ExportCompleted):
        revision = _apply_export(repo, env, p)
    elif isinstance(p, AliasMoved):
        revision = _apply_alias_moved(repo, env, p)
    repo.record_applied(
        env.event_id, env.type, env.tenant, env.policy, revision=revision, at=env.occurred_at
    )
    return Outcome.APPLIED


def _apply_export(repo: CatalogRepository, env: Envelope[Any], p: ExportCompleted) -> int:
    try:
        return _register(repo, env, p)
    except PolicyNotFound:
        # The first export of a policy creates it, so a rebuild from the log creates it too.
        repo.create_policy(env.tenant, env.policy, p.base_model, by=env.producer,
                           at=env.occurred_at)  # fmt: skip
        return _register(repo, env, p)


def _register(repo: CatalogRepository, env: Envelope[Any], p: ExportCompleted) -> int:
    rev = repo.register_revision(
        env.tenant,
        env.policy,
        digest=p.adapter_digest,
        store_uri=p.store_uri,
        base_model=p.base_model,
        parent_revision=p.parent_revision,
        revision=p.revision,
        source_event_id=env.event_id,
        metadata={
            "size_bytes": p.size_bytes,
            "rank": p.rank,
            "lora_alpha": p.lora_alpha,
            "target_modules": list(p.target_modules),
            "target_parameters": list(p.target_parameters),
            "base_model_fingerprint": p.base_model_fingerprint,
        },
        by=env.producer,
        at=env.occurred_at,
        source_checked=True,  # apply_event just read that this event was not applied
    )
    return rev.revision


def _apply_alias_moved(repo: CatalogRepository, env: Envelope[Any], p: AliasMoved) -> int:
    target = repo.get_revision(env.tenant, env.policy, p.to_revision)
    if target.digest != p.adapter_digest:
        raise Conflict(
            f"alias.moved {env.event_id} says {env.policy_id}@{p.to_revision} has digest "
            f"{p.adapter_digest}, the catalog has {target.digest}: the event is wrong or the "
            "catalog was built from another log"
        )
    repo.move_alias(
        env.tenant, env.policy, p.alias, p.to_revision, expected=p.from_revision,
        by=p.requested_by or env.producer, reason=p.reason, event_id=env.event_id,
        at=env.occurred_at, kind=p.cause,
    )  # fmt: skip
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
            cmd.tenant, cmd.policy, p.alias, p.revision, expected=expected, by=by,
            reason=p.reason, event_id=move_id, at=cmd.occurred_at, kind="promote",
        )  # fmt: skip
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
            cmd.tenant, cmd.policy, p.alias, to=p.to_revision, by=by,
            reason=p.reason or "rollback", event_id=move_id, at=cmd.occurred_at,
        )  # fmt: skip
    else:
        raise TypeError(f"{cmd.type!r} is not a serving command (serving.promote/rollback)")
    target = repo.get_revision(cmd.tenant, cmd.policy, move.to_revision)
    return make_event(
        AliasMoved(
            alias=move.alias, from_revision=move.from_revision, to_revision=move.to_revision,
            adapter_digest=target.digest, store_uri=target.store_uri,
            cause="rollback" if move.kind == "rollback" else "promote", reason=move.reason,
            requested_by=move.moved_by,
        ),
        tenant=cmd.tenant, policy=cmd.policy, producer=producer, caused_by=cmd,
        event_id=move_id, occurred_at=move.moved_at,
    )  # fmt: skip


def _current(repo: CatalogRepository, tenant: str, policy: str, alias: str) -> int | None:
    try:
        return repo.get_alias(tenant, policy, alias).revision
    except AliasNotFound:
        return None

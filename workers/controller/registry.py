"""Registry commands the controller carries out: tagging a revision and retiring a policy.

Tenants and operators ask on ``serving.commands`` (their grants); the controller checks the
command against the catalog and publishes the fact (``revision.tagged``, ``policy.retired``) on
``serving.events``, whose id derives from the command's so that a redelivered command re-emits
the same fact; the projector records it (the controller's role may not write revisions or
policies). A revision's tag set is kept in the controller's state when it publishes one, so the
next command of that policy builds on it even before the projector recorded it. A command the
catalog refuses (no such revision or policy) is answered by ``serving.refused``.
"""

from __future__ import annotations

import uuid
from typing import Any

from catalog.exceptions import CatalogError, CatalogUnavailable
from schemas import Envelope
from schemas.envelope import make_reply
from schemas.events import (
    PolicyRetirement,
    RetireCommand,
    RevisionTagged,
    ServingRefused,
    TagCommand,
)
from workers.controller import metrics

_NS = uuid.UUID("0c7d8e21-4b5a-4f3e-9d6c-7a1b2e3f4c5d")


TAGS_STATE = "controller.tags"  # worker_state: "tenant/policy@N" -> the tag set last published


def carry_out(
    repo: Any, tags_state: Any, cmd: Envelope[Any], *, producer: str
) -> list[Envelope[Any]]:
    """The fact ``cmd`` leads to, or its refusal."""
    p, t, pol = cmd.payload, cmd.tenant, cmd.policy
    by = p.requested_by or cmd.producer
    try:
        if isinstance(p, TagCommand):
            key = f"{cmd.policy_id}@{p.revision}"
            held = tags_state.get(key)
            current = repo.get_revision(t, pol, p.revision).tags  # RevisionNotFound: refused
            have = set(held["tags"] if held is not None else current)
            tags = sorted((have | set(p.add)) - set(p.remove))
            fact: Any = RevisionTagged(revision=p.revision, tags=tags, requested_by=by)
            tags_state[key] = {"tags": tags}  # before it is published
        elif isinstance(p, RetireCommand):
            repo.get_policy(t, pol)  # PolicyNotFound: refused
            fact = PolicyRetirement(retired=p.retired, reason=p.reason, requested_by=by)
        else:
            raise TypeError(f"{cmd.type!r} is not a registry command")
    except CatalogUnavailable:
        raise  # the consumer loop waits the outage out; the command is never dropped
    except CatalogError as e:
        metrics.REFUSALS.labels(cmd.type).inc()
        refused = ServingRefused(
            command_id=cmd.event_id, command_type=cmd.type, reason=f"{type(e).__name__}: {e}"
        )
        return [_reply(refused, cmd, producer, "refused")]
    return [_reply(fact, cmd, producer, "fact")]


def _reply(payload: Any, cmd: Envelope[Any], producer: str, what: str) -> Envelope[Any]:
    return make_reply(
        payload,
        cmd,
        producer=producer,
        event_id=uuid.uuid5(_NS, f"{cmd.event_id}:{what}"),
        occurred_at=cmd.occurred_at,
    )

"""What the controller knows of a policy's canary (``worker_state`` name ``controller.canary``,
key ``tenant/policy``: one canary per policy at a time, on the alias it names): the routing it
started, the rule it is judged by, what each side was seen to do, and the decision once there
is one (``verdict`` applies the rule). ``mint canary status`` reads it live.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.events import CanaryRule, CanarySide

CANARY_STATE = "controller.canary"
EARLY_SCORES = 2_000  # scores read before their answer (topics are not ordered among each other)


def canary_key(tenant: str, policy: str) -> str:
    """The view's key: the policy (its latest canary, running or decided)."""
    return f"{tenant}/{policy}"


class CanaryDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    outcome: Literal["promoted", "rolled_back"]
    reason: str
    decided_at: datetime
    deciding_event_at: datetime | None = None
    deciding_event_id: uuid.UUID
    requested_by: str = ""
    done: bool = False  # the catalog carried it out and the facts were published


class CanaryView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    canary_id: uuid.UUID
    alias: str
    revision: int
    incumbent_revision: int
    share: float
    started_at: datetime
    started_by: str = ""
    rule: CanaryRule = Field(default_factory=CanaryRule)
    canary: CanarySide
    incumbent: CanarySide
    # highest offset counted per "topic:partition": a redelivered answer or score counts once
    offsets: dict[str, int] = Field(default_factory=dict)
    early_scores: dict[str, float] = Field(default_factory=dict)
    decision: CanaryDecision | None = None

    @property
    def live(self) -> bool:
        return self.decision is None

    def side(self, revision: int | None) -> CanarySide | None:
        if revision == self.revision:
            return self.canary
        if revision == self.incumbent_revision:
            return self.incumbent
        return None


def verdict(view: CanaryView) -> tuple[str, str] | None:
    """(outcome, reason) once the rule can judge, else None."""
    r, c, i = view.rule, view.canary, view.incumbent
    if c.answers < r.min_answers or c.scores < r.min_scores:
        return None
    lost = []
    if c.failure_rate > i.failure_rate + r.max_failure_increase:
        lost.append(
            f"failure rate {c.failure_rate:.2%} above the incumbent's {i.failure_rate:.2%} "
            f"+ {r.max_failure_increase:.2%}"
        )
    if (
        c.mean_score is not None
        and i.mean_score is not None
        and c.mean_score < i.mean_score - r.max_score_drop
    ):
        lost.append(
            f"mean feedback {c.mean_score:.3f} below the incumbent's {i.mean_score:.3f} "
            f"- {r.max_score_drop}"
        )
    figures = f"{_figures(c)} against incumbent {_figures(i)}"
    if lost:
        return "rolled_back", f"canary lost: {'; '.join(lost)} ({figures})"
    return "promoted", f"canary won ({figures})"


def _figures(s: CanarySide) -> str:
    score = f", mean score {s.mean_score:.3f} of {s.scores}" if s.scores else ""
    return f"r{s.revision}: {s.answers} answers, {s.failure_rate:.2%} failed{score}"


@functools.lru_cache(maxsize=8)
def _canary_table(session: Any, keyspace: str) -> Any:
    """One StateTable (its two prepared statements) per session and keyspace: a gateway reads
    a view per request, and preparing is a round trip to Cassandra."""
    from catalog.state import StateTable

    return StateTable(session, keyspace, CANARY_STATE)


def read_canary_view(session: Any, keyspace: str, tenant: str, policy: str) -> CanaryView | None:
    """The controller's view of ``tenant/policy``'s latest canary (one per policy at a time,
    on the alias it names; its ``worker_state`` document), running or decided, or None when
    the policy never had one. One read for the SDK, the CLI and the gateway."""
    from schemas.envelope import validation_message
    from schemas.exceptions import MintError

    doc = _canary_table(session, keyspace).get(canary_key(tenant, policy))
    if doc is None:
        return None
    try:
        return CanaryView.model_validate(doc)
    except ValidationError as e:  # a controller of another version wrote it
        raise MintError(
            validation_message(
                e,
                f"the controller's canary view of {tenant}/{policy} is not one this client "
                "reads (upgrade the client to the controller's version)",
            )
        ) from None

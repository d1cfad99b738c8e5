"""Canary releases: a share of an alias's traffic goes to a new revision while the rest stays on
the incumbent, and the controller promotes or ends it on what serving sees.

``serving.canary`` is the command (``mint promote t/p@3 --canary 0.1``); ``canary.started`` and
``canary.ended`` are the catalog's record of it on ``serving.events`` (engines re-resolve the
alias on either, so a start or an end takes effect on the next request); ``feedback.submitted``
is an online score of one answer, produced by downstream systems or the gateway
(``POST /v1/feedback``), that the controller joins to the revision that answered.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from schemas.envelope import Command, Payload
from schemas.events.inference import REQUEST_ID_RE
from schemas.names import AliasName, Digest, StoreUri


class CanaryRule(BaseModel):
    """When a canary wins or loses (part of a policy's configuration). The canary is judged once
    it has ``min_answers`` answers (and ``min_scores`` feedback scores): it wins when its failure
    rate is at most the incumbent's + ``max_failure_increase`` and its mean feedback is at least
    the incumbent's − ``max_score_drop`` (the score test is skipped while either side has no
    score); otherwise it is ended and the alias stays where it was."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_answers: int = Field(200, ge=1, le=10_000_000, description="canary answers before judging")
    min_scores: int = Field(
        0, ge=0, le=10_000_000, description="canary feedback scores before judging (0: none needed)"
    )
    max_failure_increase: float = Field(
        0.01, ge=0.0, le=1.0, description="canary failure rate may exceed the incumbent's by this"
    )
    max_score_drop: float = Field(
        0.02,
        ge=0.0,
        le=1.0,
        description="canary mean feedback may fall below the incumbent's by this",
    )


class CanaryCommand(Command):
    """Command: send ``share`` of ``alias``'s traffic, sticky per caller, to ``revision``
    while the rest stays on the incumbent (the revision the alias points to now)."""

    event_type = "serving.canary"
    topic = "serving.commands"

    alias: AliasName = "prod"
    revision: int = Field(ge=1, description="the canary revision")
    share: float = Field(gt=0.0, lt=1.0, description="share of the alias's callers it gets")
    expected_revision: int | None = Field(
        None, ge=1, description="compare-and-set: start only if the alias points here now"
    )
    reason: str = Field("", max_length=1024)
    requested_by: str = Field("", max_length=256)


class CanarySide(BaseModel):
    """What one side of a canary (the canary or the incumbent) was seen to do."""

    model_config = ConfigDict(extra="forbid")

    revision: int = Field(ge=1)
    answers: int = Field(0, ge=0, description="infer.completed")
    failures: int = Field(0, ge=0, description="infer.failed of stage load or generate")
    latency_ms_sum: float = Field(0.0, ge=0.0)
    scores: int = Field(0, ge=0, description="feedback scores joined to its answers")
    score_sum: float = Field(0.0, ge=0.0)

    @property
    def failure_rate(self) -> float:
        total = self.answers + self.failures
        return self.failures / total if total else 0.0

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.scores if self.scores else None

    @property
    def mean_latency_ms(self) -> float | None:
        return self.latency_ms_sum / self.answers if self.answers else None


class CanaryStarted(Payload):
    """A canary runs: ``share`` of ``alias``'s callers get ``revision``, the rest
    ``incumbent_revision``."""

    event_type = "canary.started"
    topic = "serving.events"

    alias: AliasName
    canary_id: uuid.UUID = Field(description="the canary command's event id (routing salt)")
    incumbent_revision: int = Field(ge=1)
    revision: int = Field(ge=1)
    adapter_digest: Digest
    store_uri: StoreUri
    share: float = Field(gt=0.0, lt=1.0)
    reason: str = Field("", max_length=1024)
    requested_by: str = Field("", max_length=256)


class CanaryEnded(Payload):
    """A canary ended: ``promoted`` (the alias moved to it: an ``alias.moved`` follows) or
    ``rolled_back`` (the alias stays on the incumbent), with the figures that decided it."""

    event_type = "canary.ended"
    topic = "serving.events"

    alias: AliasName
    canary_id: uuid.UUID
    revision: int = Field(ge=1)
    incumbent_revision: int = Field(ge=1)
    outcome: Literal["promoted", "rolled_back"]
    reason: str = Field("", max_length=2048)
    canary: CanarySide | None = None
    incumbent: CanarySide | None = None
    deciding_event_at: AwareDatetime | None = Field(
        None, description="time of the answer or score that decided it (None: a command did)"
    )
    requested_by: str = Field("", max_length=256)


class FeedbackSubmitted(Command):
    """An online score of one answer (``request_id`` of the policy's request), in [0, 1]."""

    event_type = "feedback.submitted"
    topic = "feedback"

    request_id: str = Field(pattern=REQUEST_ID_RE, description="the answered request's id")
    score: float = Field(ge=0.0, le=1.0, description="1 best, 0 worst")
    comment: str = Field("", max_length=1024)
    submitted_by: str = Field("", max_length=256)

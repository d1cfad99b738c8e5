"""The bodies of the ``/mint/v1`` lifecycle routes (gateway/lifecycle.py) and how the
controller's answers read back: each body is checked where it enters, field by field, before
anything is sent."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from catalog.exceptions import InvalidReference
from catalog.refs import check_alias
from schemas.events import Threshold
from schemas.events.serving import check_tag_change
from schemas.names import AliasName, MetricName, TagName


class AliasBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alias: str = "prod"

    @field_validator("alias")
    @classmethod
    def _alias(cls, v: str) -> str:
        try:
            return check_alias(v)
        except InvalidReference as e:
            raise ValueError(str(e)) from None


class PromoteBody(AliasBody):
    revision: int = Field(ge=1)
    expected_revision: int | None = Field(None, ge=1)
    reason: str = Field("", max_length=1024)
    # a share of the alias's callers for a canary of ``revision`` (None: move the alias)
    canary: float | None = Field(None, gt=0.0, lt=1.0, strict=True)


class RollbackBody(AliasBody):
    to_revision: int | None = Field(None, ge=1)
    expected_revision: int | None = Field(None, ge=1)
    reason: str = Field("", max_length=1024)


class TagBody(BaseModel):
    """Tags to add to a revision and to take off (a registry's labels)."""

    model_config = ConfigDict(extra="forbid")
    add: list[TagName] = Field(default_factory=list, max_length=32)
    remove: list[TagName] = Field(default_factory=list, max_length=32)

    @model_validator(mode="after")
    def _a_change(self) -> TagBody:  # checked here too: a bad body is a 400, and nothing is sent
        check_tag_change(self.add, self.remove)
        return self


class LifecycleBody(BaseModel):
    """A policy's lifecycle (PolicyConfigured without its base model): a full replacement."""

    model_config = ConfigDict(extra="forbid")
    suite: str = Field(min_length=1, max_length=128)
    thresholds: dict[MetricName, Threshold] = Field(default_factory=dict, max_length=32)
    promote_to: AliasName = "prod"
    auto_evaluate: bool = True
    auto_promote: bool = True
    rollback_metric: MetricName | None = None
    rollback_tolerance: float = Field(0.0, ge=0.0)


class RetireBody(BaseModel):
    """Retire the policy (no new revisions, no alias moves; what it has stays readable and
    served), or restore it with ``undo``."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field("", max_length=1024)
    undo: bool = Field(False, strict=True)


def answer_body(policy: str, answer: Any) -> dict[str, Any]:
    """The controller's answer to a serving command, as the route returns it."""
    p, event_id = answer.payload, str(answer.event_id)
    if answer.type == "policy.retired":
        return {
            "policy": policy,
            "retired": p.retired,
            "reason": p.reason,
            "event_id": event_id,
        }
    if answer.type == "revision.tagged":
        return {
            "policy": policy,
            "revision": p.revision,
            "tags": list(p.tags),
            "event_id": event_id,
        }
    out = {"policy": policy, "alias": p.alias}
    if answer.type == "canary.started":
        out |= {
            "revision": p.revision,
            "incumbent_revision": p.incumbent_revision,
            "share": p.share,
            "canary_id": str(p.canary_id),
        }
    elif answer.type == "canary.ended":
        out |= {"canary_id": str(p.canary_id), "outcome": p.outcome, "reason": p.reason}
    else:  # alias.moved
        out |= {"from_revision": p.from_revision, "to_revision": p.to_revision, "cause": p.cause}
    return {**out, "event_id": event_id}

"""Evaluation: score a revision on a suite and gate promotion on thresholds."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.envelope import Command, Payload
from schemas.names import Digest, MetricName


class Threshold(BaseModel):
    """Bounds a metric must meet: ``min <= value <= max`` (either side optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> Self:
        if self.min is None and self.max is None:
            raise ValueError("a threshold needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"threshold min {self.min} is above max {self.max}")
        return self

    def met_by(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


def threshold_failures(metrics: dict[str, float], thresholds: dict[str, Threshold]) -> list[str]:
    """Names of thresholded metrics that are missing or out of bounds (empty: passed)."""
    return sorted(
        name for name, t in thresholds.items() if name not in metrics or not t.met_by(metrics[name])
    )


class EvalRequested(Command):
    """Command: evaluate a revision on a suite; thresholds gate promotion."""

    event_type = "eval.requested"
    topic = "eval.requests"

    revision: int = Field(ge=1)
    adapter_digest: Digest
    suite: str = Field(min_length=1, max_length=128, description="evaluation suite name")
    thresholds: dict[MetricName, Threshold] = Field(default_factory=dict)
    promote_to: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9-]{0,31}$", description="alias to promote to when passed"
    )


class EvalCompleted(Payload):
    """Result of an evaluation: metrics, the thresholds applied, and the verdict."""

    event_type = "eval.completed"
    topic = "eval.results"

    revision: int = Field(ge=1)
    adapter_digest: Digest
    suite: str = Field(min_length=1, max_length=128)
    metrics: dict[MetricName, float]
    thresholds: dict[MetricName, Threshold] = Field(default_factory=dict)
    passed: bool
    failures: list[MetricName] = Field(default_factory=list)
    refused: str | None = Field(
        None,
        max_length=2048,
        description="why the evaluator did not run it (e.g. a suite not "
        "configured for the policy); metrics are then empty and passed is false",
    )

    @model_validator(mode="after")
    def _verdict_consistent(self) -> Self:
        if self.refused is not None:
            if self.metrics or self.passed or self.failures:
                raise ValueError(
                    "a refused evaluation has no metrics, passed=false and no "
                    "failures; leave refused unset for one that ran"
                )
            return self
        expected = threshold_failures(self.metrics, self.thresholds)
        if sorted(self.failures) != expected or self.passed != (not expected):
            raise ValueError(
                f"passed={self.passed}, failures={self.failures} disagree with metrics and "
                f"thresholds (failing: {expected}); compute them with threshold_failures()"
            )
        return self

"""Lifecycle configuration of a policy: its evaluation gate and rollback rule.

Published on the compacted ``policy.config`` topic (keyed by policy), so the latest configuration
of every policy stays in the log forever and a restarted controller rebuilds its tables from it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from schemas.envelope import Command
from schemas.events.canary import CanaryRule
from schemas.events.evaluation import Threshold
from schemas.names import AliasName, MetricName


class PolicyConfigured(Command):
    """Command: set a policy's lifecycle (evaluation suite, promotion gate, rollback rule)."""

    event_type = "policy.configured"
    topic = "policy.config"

    base_model: str = Field(min_length=1, max_length=512, description="base model id or path")
    suite: str = Field(min_length=1, max_length=128, description="evaluation suite name")
    thresholds: dict[MetricName, Threshold] = Field(
        default_factory=dict, description="the gate: a revision is promoted only if all are met"
    )
    promote_to: AliasName = Field("prod", description="alias a passing revision moves to")
    auto_evaluate: bool = Field(True, description="evaluate every exported revision")
    auto_promote: bool = Field(True, description="promote a revision that passes the gate")
    rollback_metric: MetricName | None = Field(
        None, description="metric watched on the serving revision (None: no automatic rollback)"
    )
    rollback_tolerance: float = Field(
        0.0,
        ge=0.0,
        description="roll back when the metric falls more than this below the "
        "value it had when the revision was promoted",
    )
    # Added (optional, backward compatible): when a canary (`mint promote --canary`) wins.
    canary: CanaryRule = Field(
        default_factory=CanaryRule, description="when a canary of this policy wins or loses"
    )
    requested_by: str = Field("", max_length=256)


def suite_refusal(policy_id: str, configured: dict[str, Any] | None, suite: str) -> str | None:
    """Why an evaluation on ``suite`` may not decide anything for the policy, or None when it is
    the configured suite. ``configured`` is the policy's latest ``policy.configured`` payload
    (as JSON). One check for the evaluator (which refuses the request) and the controller (which
    lets no such result gate, become a baseline or roll back)."""
    if not configured:
        return (
            f"policy {policy_id} has no lifecycle configuration, so no suite is configured "
            f"for it (asked for {suite!r}): configure it with `mint policies configure "
            f"{policy_id} --suite …` and request the evaluation again"
        )
    if suite != configured["suite"]:
        return (
            f"suite {suite!r} is not the one configured for {policy_id} "
            f"({configured['suite']!r}): request {configured['suite']!r}, or reconfigure "
            "the policy's suite with `mint policies configure`"
        )
    return None

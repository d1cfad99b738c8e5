"""The SDK's serving verbs (promote, rollback, canary releases, feedback): each publishes its
command and waits for the controller's answer, like every MintClient verb (mint.sdk.client).

    started = mint.promote("math-rl", 7, canary=0.1)   # 10% of prod's callers get revision 7
    mint.feedback("math-rl", answer.request_id, 0.9)   # an online score of one answer
    view = mint.canary_status("math-rl")               # what the controller judges it on
    mint.rollback("math-rl")                           # ends a running canary (prod stays)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from mint.sdk.exceptions import CommandRefused
from mint.sdk.watcher import answering
from schemas import Envelope
from schemas.envelope import validation_message
from schemas.events import (
    AliasMoved,
    CanaryCommand,
    CanaryEnded,
    CanaryStarted,
    FeedbackSubmitted,
    PromoteCommand,
    RollbackCommand,
)
from schemas.exceptions import EventValidationError

if TYPE_CHECKING:
    from workers.controller.canary_view import CanaryView


def _build(model: type, what: str, **fields: Any) -> Any:
    """The payload, or one error naming each wrong field (nothing was sent)."""
    try:
        return model(**fields)
    except ValidationError as e:
        raise EventValidationError(validation_message(e, f"cannot send {what}")) from None


class ServingVerbs:
    """Mixed into MintClient: uses its send, wait_for, catalog, tenant and name."""

    def promote(
        self,
        policy: str,
        revision: int,
        *,
        alias: str = "prod",
        expected_revision: int | None = None,
        reason: str = "",
        canary: float | None = None,
    ) -> Envelope[AliasMoved] | Envelope[CanaryStarted]:
        """Move ``alias`` to ``revision`` (through the controller, by compare-and-set): the
        ``alias.moved`` it caused.

        With ``canary=share`` (0 < share < 1) the alias does not move: ``share`` of its callers
        (sticky per caller) get ``revision`` and the rest stay on the incumbent until the
        controller judges the canary by the policy's canary rule (then ``canary.ended``, and an
        ``alias.moved`` if it won); returns the ``canary.started``. A refusal (a stale
        ``expected_revision``, a canary already running) raises CommandRefused."""
        if canary is not None:
            cmd = self.send(
                policy,
                _build(
                    CanaryCommand,
                    "serving.canary",
                    alias=alias,
                    revision=revision,
                    share=canary,
                    expected_revision=expected_revision,
                    reason=reason,
                    requested_by=self.name,
                ),
            )
            return self._answer(cmd, "canary.started")
        cmd = self.send(
            policy,
            PromoteCommand(
                alias=alias,
                revision=revision,
                expected_revision=expected_revision,
                reason=reason,
                requested_by=self.name,
            ),
        )
        return self._answer(cmd, "alias.moved")

    def rollback(
        self,
        policy: str,
        *,
        alias: str = "prod",
        to_revision: int | None = None,
        reason: str = "",
        expected_revision: int | None = None,
    ) -> Envelope[AliasMoved] | Envelope[CanaryEnded]:
        """Move ``alias`` back to its previous revision (or ``to_revision``): the
        ``alias.moved``. While a canary of the alias runs, the rollback ends the canary instead
        (the alias stays where it is): then the answer is the ``canary.ended``
        (outcome ``rolled_back``)."""
        cmd = self.send(
            policy,
            RollbackCommand(
                alias=alias,
                to_revision=to_revision,
                expected_revision=expected_revision,
                reason=reason or "rollback",
                requested_by=self.name,
            ),
        )
        return self._answer(cmd, "alias.moved", "canary.ended")

    def _answer(self, cmd: Envelope[Any], *types: str) -> Envelope[Any]:
        """The first of ``types`` in ``cmd``'s chain, or CommandRefused on its serving.refused."""
        answer = self.wait_for(
            answering(cmd, *types, "serving.refused"),
            request=cmd,
            what=f"{'/'.join(types)} or serving.refused to {cmd.type} {cmd.event_id}",
        )
        if answer.type == "serving.refused":
            p = answer.payload
            raise CommandRefused(
                f"{cmd.type} of {cmd.policy_id}@{p.alias} refused: {p.reason}",
                current_revision=p.current_revision,
            )
        return answer

    def canary_status(self, policy: str, alias: str | None = "prod") -> CanaryView | None:
        """What the controller knows of the latest canary of ``policy@alias``, live or decided
        (routing, rule, each side's answers, failures, latency and scores, the decision;
        ``workers.controller.canary_view.CanaryView``), or None when the policy's latest canary
        was not on ``alias`` (``alias=None``: whichever alias it was on) or there never was one.
        A policy runs one canary at a time."""
        cat = self.catalog
        from workers.controller.canary_view import read_canary_view

        view = read_canary_view(cat.session, cat.keyspace, self.tenant, policy)
        return view if view is not None and alias in (None, view.alias) else None

    def feedback(
        self, policy: str, request_id: str, score: float, comment: str = ""
    ) -> Envelope[FeedbackSubmitted]:
        """Score one answer of ``policy`` (``request_id``: the answered request's id, e.g.
        ``mint.infer(...).request_id``) in [0, 1], 1 best: the controller joins it to the
        revision that answered and judges a running canary on it. Publishes
        ``feedback.submitted`` on ``feedback`` (nothing to wait for); a bad field raises
        EventValidationError before anything is sent."""
        payload = _build(
            FeedbackSubmitted,
            "feedback.submitted",
            request_id=request_id,
            score=score,
            comment=comment,
            submitted_by=self.name,
        )
        return self.send(policy, payload)

"""The verbs both clients share, written once over a transport (mint.sdk.transport): each builds
and validates its request here (pydantic: a bad field raises EventValidationError, or
InvalidSampling, before anything is sent) and shapes its answer here; the transport only
carries the request and brings back what answered it.

    mint.promote("math-rl", 7)                       # alias.moved (through the controller)
    started = mint.promote("math-rl", 8, canary=0.1)  # 10% of prod's callers get revision 8
    mint.feedback("math-rl", request_id, 0.9)         # an online score of one answer
    view = mint.canary_status("math-rl")              # what the controller judges it on
    mint.rollback("math-rl")                          # ends a running canary (prod stays)
    mint.tag("math-rl", 7, add=["reviewed"])          # ['reviewed']: the revision's tags now
    mint.retire("math-rl", reason="superseded")

A serving or registry command is carried out by the controller, which checks it against the
catalog (compare-and-set on an alias) and answers with the fact (``alias.moved``,
``canary.started``/``canary.ended``, ``revision.tagged``, ``policy.retired``), or refuses it:
CommandRefused with its reason (and the alias's ``current_revision``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from pydantic import ValidationError

from catalog.exceptions import NotFound
from mint.sdk.sampling import SamplingFields, sampling_options
from schemas.envelope import validation_message
from schemas.events import (
    CanaryCommand,
    FeedbackSubmitted,
    InferRequested,
    PromoteCommand,
    RetireCommand,
    RollbackCommand,
    TagCommand,
)
from schemas.events.sampling import SamplingOptions
from schemas.exceptions import EventValidationError

if TYPE_CHECKING:
    from mint.sdk.transport import Transport
    from workers.controller.canary_view import CanaryView


def build(model: type, **fields: Any) -> Any:
    """The payload, or one error naming each wrong field (nothing was sent)."""
    try:
        return model(**fields)
    except ValidationError as e:
        what = getattr(model, "event_type", model.__name__)
        raise EventValidationError(validation_message(e, f"cannot send {what}")) from None


class Verbs:
    """The shared verbs; a client supplies ``transport`` (direct or HTTP)."""

    transport: Transport

    # ------------------------------------------------------------------ catalog reads

    def policies(self) -> list[Any]:
        """The tenant's policies (base model, created_at, retired_at)."""
        return self.transport.policies()

    def revisions(self, policy: str, limit: int | None = None) -> list[Any]:
        """The policy's revisions, newest first (at most ``limit``; None: all of them, or the
        gateway's first 100), each with ``training`` (steps, tokens, loss, reward, …) and
        ``tags``."""
        return self.transport.revisions(policy, limit)

    def latest_revision(self, policy: str) -> int | None:
        try:
            rows = self.transport.revisions(policy, 1)
        except NotFound:  # no revision yet (the catalog has no row of the policy)
            return None
        return rows[0].revision if rows else None

    def aliases(self, policy: str) -> list[Any]:
        return self.transport.aliases(policy)

    def canary_status(self, policy: str, alias: str | None = "prod") -> CanaryView | None:
        """What the controller knows of the latest canary of ``policy@alias``, live or decided
        (routing, rule, each side's answers, failures, latency and scores, the decision;
        ``workers.controller.canary_view.CanaryView``), or None when the policy's latest canary
        was not on ``alias`` (``alias=None``: whichever alias it was on) or there never was one.
        A policy runs one canary at a time."""
        view = self.transport.canary_view(policy)
        return view if view is not None and alias in (None, view.alias) else None

    # ------------------------------------------------------------------ alias moves

    def promote(
        self,
        policy: str,
        revision: int,
        *,
        alias: str = "prod",
        expected_revision: int | None = None,
        reason: str = "",
        canary: float | None = None,
    ) -> Any:
        """Move ``alias`` to ``revision`` (through the controller, by compare-and-set): the
        ``alias.moved`` it caused.

        With ``canary=share`` (0 < share < 1) the alias does not move: ``share`` of its callers
        (sticky per caller) get ``revision`` and the rest stay on the incumbent until the
        controller judges the canary by the policy's canary rule (then ``canary.ended``, and an
        ``alias.moved`` if it won); returns the ``canary.started``. A refusal (a stale
        ``expected_revision``, a canary already running) raises CommandRefused."""
        fields = dict(
            alias=alias,
            revision=revision,
            expected_revision=expected_revision,
            reason=reason,
            requested_by=self.transport.name,
        )
        if canary is not None:
            cmd = build(CanaryCommand, share=canary, **fields)
            return self.transport.command(policy, cmd, ("canary.started",), f"@{alias}")
        cmd = build(PromoteCommand, **fields)
        return self.transport.command(policy, cmd, ("alias.moved",), f"@{alias}")

    def rollback(
        self,
        policy: str,
        *,
        alias: str = "prod",
        to_revision: int | None = None,
        reason: str = "",
        expected_revision: int | None = None,
    ) -> Any:
        """Move ``alias`` back to its previous revision (or ``to_revision``): the
        ``alias.moved``. While a canary of the alias runs, the rollback ends the canary instead
        (the alias stays where it is): then the answer is the ``canary.ended``
        (outcome ``rolled_back``)."""
        cmd = build(
            RollbackCommand,
            alias=alias,
            to_revision=to_revision,
            expected_revision=expected_revision,
            reason=reason or "rollback",
            requested_by=self.transport.name,
        )
        return self.transport.command(policy, cmd, ("alias.moved", "canary.ended"), f"@{alias}")

    # ------------------------------------------------------------------ registry

    def tag(
        self,
        policy: str,
        revision: int,
        add: Iterable[str] = (),
        remove: Iterable[str] = (),
        *,
        timeout_s: float | None = None,
    ) -> list[str]:
        """Add ``add`` to revision ``revision``'s tags and take ``remove`` off (labels such as
        "candidate", "reviewed", "release-2026-12": letters, digits, '.', '_', '-'; at most 64
        characters). Returns the revision's tags afterwards, sorted (the ``revision.tagged``
        fact carries the whole set). A bad tag, or nothing to do, raises EventValidationError
        before anything is sent; a revision the catalog lacks raises CommandRefused."""
        cmd = build(
            TagCommand,
            revision=revision,
            add=list(dict.fromkeys(add)),
            remove=list(dict.fromkeys(remove)),
            requested_by=self.transport.name,
        )
        answer = self.transport.command(
            policy, cmd, ("revision.tagged",), f"@{revision}", timeout_s=timeout_s
        )
        return sorted(answer.payload.tags)

    def retire(
        self, policy: str, reason: str = "", undo: bool = False, *, timeout_s: float | None = None
    ) -> Any:
        """Retire ``policy`` (``undo``: restore it) through the controller: no new revision or
        alias move while retired; its revisions and aliases stay readable and served. Returns
        the controller's ``policy.retired`` (the direct client waits until the catalog records
        it and returns the policy's row). CommandRefused: the controller's reason; WaitTimeout:
        it applies when the controller runs (the command stays on serving.commands)."""
        cmd = build(
            RetireCommand, retired=not undo, reason=reason, requested_by=self.transport.name
        )
        return self.transport.command(policy, cmd, ("policy.retired",), "", timeout_s=timeout_s)

    # ------------------------------------------------------------------ answers

    def feedback(self, policy: str, request_id: str, score: float, comment: str = "") -> Any:
        """Score one answer of ``policy`` (``request_id``: ``infer(...).request_id``, or the
        HTTP answer's ``id``) in [0, 1], 1 best: the controller joins it to the revision that
        answered and judges a running canary on it. Nothing to wait for: returns the published
        ``feedback.submitted`` (over HTTP, its event id). A bad field raises
        EventValidationError before anything is sent."""
        payload = build(
            FeedbackSubmitted,
            request_id=request_id,
            score=score,
            comment=comment,
            submitted_by=self.transport.name,
        )
        return self.transport.publish(policy, payload)

    def infer(
        self,
        policy: str,
        prompt: str,
        *,
        alias: str = "prod",
        revision: int | None = None,
        max_tokens: int = 8,
        temperature: float = 0.0,
        request_id: str | None = None,
        chat: bool = False,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
        sampling: SamplingOptions | dict[str, Any] | None = None,
        **options: Unpack[SamplingFields],
    ) -> Any:
        """Answer a prompt with ``policy@alias`` (or a pinned revision). ``chat`` sends the
        prompt as a user turn of the model's chat template (instruct models). Direct: the
        ``infer.completed`` payload (RequestFailed on ``infer.failed``); HTTP: a Completion
        from the gateway's OpenAI endpoints (``id`` is what ``feedback`` scores).

        vLLM's other settings are keywords (mint.sdk.sampling: ``top_k``, ``min_p``,
        ``repetition_penalty``, ``stop_token_ids``, ``top_logprobs``, …) or ``sampling=``; and
        ``json_schema=`` / ``json_object=True`` / ``regex=`` / ``choice=`` / ``grammar=``
        constrain the answer's text::

            r = mint.infer("extract", "Alice is 31.", chat=True, max_tokens=64,
                           json_schema={"type": "object", "required": ["name", "age"],
                                        "properties": {"name": {"type": "string"},
                                                       "age": {"type": "integer"}}})
            json.loads(r.text)  # {"name": "Alice", "age": 31}

        ``logprobs`` returns each sampled token's log-probability (``r.logprobs``);
        ``top_logprobs=k`` also returns each token's string, bytes and ``k`` alternatives
        (it implies ``logprobs``), and ``r.stop_reason`` says which stop string or token id
        ended the answer. A bad setting raises InvalidSampling before anything is sent."""
        opts = sampling_options(sampling, **options)
        request = build(
            InferRequested,
            request_id=request_id or uuid.uuid4().hex,
            alias=alias,
            revision=revision,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            chat=chat,
            top_p=top_p,
            seed=seed,
            stop=list(stop),
            logprobs=logprobs or (opts is not None and opts.top_logprobs is not None),
            sampling=opts,
        )
        return self.transport.infer(policy, request)

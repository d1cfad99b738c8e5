"""``POST /v1/feedback``: an online score of one answer, for judging canaries.

Body: ``{"model": "<policy>" | "<policy>@<alias>", "id": "<response id or engine request id>",
"score": 0..1, "comment": "..."?}``. The tenant is the API key's; the policy must be the
caller's (else the same 404 as the OpenAI routes). The score goes out as ``feedback.submitted``
on ``feedback`` (keyed by tenant/policy, through the serving commands' producer,
gateway/commands.py) and the answer is 202: the controller joins it to the revision that
answered that request (schemas/events/canary.py). Kafka not taking it is a 503 with
Retry-After: nothing was recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from catalog.refs import Ref
from gateway.api import parse_json, validate_body
from gateway.errors import BadRequest, ModelNotFound, Unavailable
from gateway.ids import request_id_of
from gateway.lifecycle import commands_of
from gateway.refs import FORMS, MAX_MODEL_CHARS, parse_model
from gateway.requests import client_of, read_body
from schemas.envelope import make_event
from schemas.events import FeedbackSubmitted

if TYPE_CHECKING:
    from gateway.service import Gateway

log = structlog.get_logger()
PATH = "/v1/feedback"
MAX_BODY_BYTES = 8 * 1024


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    id: str = Field(min_length=1, max_length=300, description="a response or request id")
    # strict: a number, never "0.5" or true (int 0 and 1 are numbers)
    score: float = Field(ge=0.0, le=1.0, strict=True, description="1 best, 0 worst")
    comment: str | None = Field(None, max_length=1024)


def policy_ref(model: str, tenant: str) -> Ref:
    """The ``model`` as a reference in the caller's tenant; a bare ``policy`` (the score is
    the policy's, whichever alias answered) reads as ``policy@prod``."""
    if "@" in model:
        return parse_model(model, tenant)
    try:
        return parse_model(f"{model}@prod", tenant)
    except BadRequest:
        raise BadRequest(
            f"model {model[:80]!r} is not 'policy' nor one of {FORMS}", param="model"
        ) from None
    except ModelNotFound:
        raise ModelNotFound(model) from None


def build_router(gw: Gateway) -> APIRouter:
    """The route; its producer is the lifecycle routes' (started and closed with them)."""
    router = APIRouter()

    @router.post(PATH)
    async def feedback(request: Request) -> JSONResponse:
        caller = await gw.authenticate(request.headers.get("authorization"), client_of(request))
        await gw.admit(caller.tenant)
        req = validate_body(FeedbackBody, parse_json(await read_body(request, MAX_BODY_BYTES)))
        ref = policy_ref(req.model, caller.tenant)
        try:  # another tenant's or a missing policy: the OpenAI routes' 404
            await gw.target(ref, req.model)
        except ModelNotFound:
            raise ModelNotFound(req.model) from None
        request_id = request_id_of(req.id)
        commands = commands_of(gw)
        if commands is None:
            raise Unavailable("this gateway takes no feedback (no Kafka)", code="not_served")
        scored = FeedbackSubmitted(
            request_id=request_id,
            score=req.score,
            comment=req.comment or "",
            submitted_by=f"key/{caller.key_id}",
        )
        env = make_event(scored, tenant=caller.tenant, policy=ref.policy, producer=gw.producer_name)
        await commands.publish(env)
        log.info("feedback submitted", policy=env.policy_id, request_id=request_id, score=req.score)
        body = {
            "object": "feedback",
            "id": str(env.event_id),
            "request_id": request_id,
            "score": req.score,
        }
        return JSONResponse(body, status_code=202)

    return router

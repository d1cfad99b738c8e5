"""A tenant's own policies over HTTP (``/mint/v1/...``), so a tenant needs only its API key:

- ``GET  /mint/v1/policies``: the caller's policies;
- ``GET  /mint/v1/policies/{policy}/revisions?limit=N``: its revisions, newest first;
- ``GET  /mint/v1/policies/{policy}/aliases``: where its aliases point;
- ``POST /mint/v1/policies/{policy}/promote`` ``{alias, revision, expected_revision?, reason?,
  canary?}``: with ``canary`` (a share in (0, 1)) a canary of ``revision`` instead of a move;
- ``POST /mint/v1/policies/{policy}/rollback`` ``{alias, to_revision?, expected_revision?,
  reason?}`` (on an alias with a running canary: ends the canary, the alias stays);
- ``POST /mint/v1/policies/{policy}/revisions/{revision}/tags`` ``{add?, remove?}``: a
  revision's labels (``revision.tag``, carried out by the controller: the tags afterwards);
- ``POST /mint/v1/policies/{policy}/retire`` ``{reason?, undo?}``: retire the policy (no new
  revisions or alias moves; what it has stays readable and served) or restore it
  (``policy.retire``, carried out by the controller: its ``policy.retired``);
- ``GET  /mint/v1/policies/{policy}/canary``: the controller's view of its latest canary (live
  or decided; ``null`` when it never had one), as ``mint canary status`` shows it;
- ``PUT  /mint/v1/policies/{policy}/lifecycle`` ``{suite, thresholds?, promote_to?, ...}``: its
  evaluation gate and rollback rule (``policy.configured`` on ``policy.config``; the base model
  is the catalog's, never the caller's).

Tenancy by construction: the tenant is the key's, the path names a policy of it, and another
tenant's policy is the same 404 as a missing one. Moves take the operators' path: a
PromoteCommand / CanaryCommand / RollbackCommand on ``serving.commands``, answered by the
controller (the only writer of aliases) with ``alias.moved``, ``canary.started`` or
``canary.ended`` (200) or ``serving.refused`` (409); no answer in time is a 504 that says the
command stays queued (gateway/commands.py). Training over HTTP is the Tinker
API (``/api/v1``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from catalog.exceptions import InvalidReference, NotFound
from catalog.refs import check_name
from gateway.api import parse_json, validate_body
from gateway.commands import Commands, KafkaCommands
from gateway.errors import ApiError, BadRequest, Unavailable
from gateway.lifecycle_bodies import (
    LifecycleBody,
    PromoteBody,
    RetireBody,
    RollbackBody,
    TagBody,
    answer_body,
)
from gateway.requests import read_body
from schemas.envelope import make_event
from schemas.events import (
    CanaryCommand,
    PolicyConfigured,
    PromoteCommand,
    RetireCommand,
    RollbackCommand,
    TagCommand,
)
from schemas.settings import MintSettings

if TYPE_CHECKING:
    from gateway.service import Gateway

log = structlog.get_logger()
M = TypeVar("M", bound=BaseModel)
PREFIX = "/mint/v1"
MAX_BODY_BYTES = 16 * 1024
MAX_REVISIONS = 500
MAX_POLICIES = 1000
MOVE_TIMEOUT_S = 30.0


class PolicyNotFound(ApiError):
    """404, the same for a missing policy and one of another tenant (no oracle)."""

    status, type, code = 404, "invalid_request_error", "policy_not_found"

    def __init__(self, policy: str) -> None:
        super().__init__(
            f"The policy '{policy[:100]}' does not exist or you do not have access to it. "
            f"List yours with GET {PREFIX}/policies.",
            param="policy",
        )


class MoveRefused(ApiError):
    """409: the controller refused the move (stale expected_revision, unknown revision, ...)."""

    status, type, code = 409, "invalid_request_error", "move_refused"

    def __init__(self, message: str, current_revision: int | None) -> None:
        super().__init__(message)
        self.current_revision = current_revision

    def body(self) -> dict[str, Any]:
        out = super().body()
        out["error"]["current_revision"] = self.current_revision
        return out


def _validated(model: type[M], raw: bytes) -> M:
    """The body as ``model`` (an empty body: ``{}``); a 400 names the field, what was given and
    what is expected (gateway.api.validate_body)."""
    return validate_body(model, parse_json(raw) if raw.strip() else {})


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def commands_of(gw: Gateway) -> Commands | None:
    """The gateway's serving commands: set by tests (``gw.lifecycle_commands``), else on the
    engines' Kafka settings; None where the gateway has no Kafka (moves answer 503). Made once
    per gateway and kept there: the lifecycle and feedback routes share its producer."""
    given = getattr(gw, "lifecycle_commands", None)
    if given is not None:
        return given
    settings = getattr(gw.engines, "settings", None)
    if isinstance(settings, MintSettings):
        made = KafkaCommands(settings, gw.config.instance_id, gw.config.retry_after_s)
        gw.lifecycle_commands = made  # type: ignore[attr-defined]
        return made
    return None


def canary_view(repo: Any, tenant: str, policy: str) -> dict[str, Any] | None:
    """The controller's view of the policy's latest canary as the route returns it: without its
    bookkeeping (the offsets it counted, scores that came before their answers)."""
    from workers.controller.canary_view import read_canary_view

    view = read_canary_view(repo.session, repo.keyspace, tenant, policy)
    if view is None:
        return None
    return view.model_dump(mode="json", exclude={"offsets", "early_scores"})


def _evaluation(e: Any) -> dict[str, Any]:
    return {
        "suite": e.suite,
        "metrics": e.metrics,
        "passed": e.passed,
        "failures": e.failures,
        "refused": e.refused,
        "evaluated_at": _iso(e.evaluated_at),
    }


def build_router(gw: Gateway) -> APIRouter:
    commands = commands_of(gw)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if commands is not None:
            await asyncio.to_thread(commands.start)
        try:
            yield
        finally:
            if commands is not None:
                await asyncio.to_thread(commands.close)

    router = APIRouter(prefix=PREFIX, lifespan=lifespan)

    async def tenant_of(request: Request) -> str:
        client = request.client.host if request.client else None
        caller = await gw.authenticate(request.headers.get("authorization"), client)
        await gw.admit(caller.tenant)
        request.state.key_id = caller.key_id
        return caller.tenant

    def repo() -> Any:
        return gw.catalog.catalog  # type: ignore[attr-defined]  # CatalogDirectory's repository

    async def policy_of(tenant: str, policy: str) -> Any:
        try:
            check_name("policy", policy)
        except InvalidReference as e:
            raise BadRequest(str(e), param="policy") from e
        try:
            return await asyncio.to_thread(repo().get_policy, tenant, policy)
        except NotFound:
            raise PolicyNotFound(policy) from None

    async def body(request: Request, model: type[M]) -> M:
        return _validated(model, await read_body(request, MAX_BODY_BYTES))

    async def move(tenant: str, policy: str, payload: Any) -> JSONResponse:
        if commands is None:
            raise Unavailable("this gateway serves no lifecycle commands", code="not_served")
        env = make_event(payload, tenant=tenant, policy=policy, producer=gw.producer_name)
        answer = await commands.send(env, MOVE_TIMEOUT_S)
        p = answer.payload
        log.info("serving command answered", policy=env.policy_id, type=answer.type)
        if answer.type == "serving.refused":
            if env.type == "revision.tag":
                what = f"@{env.payload.revision}"
            else:  # a retire names the policy itself
                what = "" if env.type == "policy.retire" else f"@{p.alias}"
            raise MoveRefused(
                f"{env.type} of {policy}{what} refused: {p.reason}", p.current_revision
            )
        return JSONResponse(answer_body(policy, answer))

    @router.get("/policies")
    async def policies(request: Request) -> JSONResponse:
        tenant = await tenant_of(request)
        rows = await asyncio.to_thread(repo().list_policies, tenant)
        data = [
            {
                "policy": p.policy,
                "base_model": p.base_model,
                "created_at": _iso(p.created_at),
                "retired_at": _iso(p.retired_at),
            }
            for p in rows[:MAX_POLICIES]
        ]
        return JSONResponse({"object": "list", "data": data})

    @router.get("/policies/{policy}/revisions")
    async def revisions(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        raw = request.query_params.get("limit", "100")
        limit = int(raw) if raw.isdigit() and len(raw) < 6 else 0
        if not 1 <= limit <= MAX_REVISIONS:
            raise BadRequest(
                f"limit {raw[:20]!r} must be an integer between 1 and {MAX_REVISIONS}",
                param="limit",
            )
        await policy_of(tenant, policy)
        rows, _ = await asyncio.to_thread(
            lambda: repo().list_revisions(tenant, policy, page_size=limit)
        )
        evals = await asyncio.to_thread(repo().evaluations_by_revision, tenant, policy)
        data = [
            {
                "revision": r.revision,
                "digest": r.digest,
                "parent_revision": r.parent_revision,
                "base_model": r.base_model,
                "created_at": _iso(r.created_at),
                "created_by": r.created_by,
                # what the registry knows of how good it is (as `mint revisions` shows)
                "training": r.training,
                "tags": r.tags,
                "evaluations": [_evaluation(e) for e in evals.get(r.revision, [])],
            }
            for r in rows[:limit]
        ]
        return JSONResponse({"object": "list", "data": data})

    @router.get("/policies/{policy}/aliases")
    async def aliases(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        await policy_of(tenant, policy)
        rows = await asyncio.to_thread(repo().list_aliases, tenant, policy)
        data = [
            {"alias": a.alias, "revision": a.revision, "seq": a.seq, "moved_at": _iso(a.moved_at)}
            for a in rows
        ]
        return JSONResponse({"object": "list", "data": data})

    @router.post("/policies/{policy}/promote")
    async def promote(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        await policy_of(tenant, policy)
        req = await body(request, PromoteBody)
        fields = req.model_dump(exclude={"canary"})
        fields["requested_by"] = f"key/{request.state.key_id}"
        if req.canary is None:
            return await move(tenant, policy, PromoteCommand(**fields))
        return await move(tenant, policy, CanaryCommand(**fields, share=req.canary))

    @router.post("/policies/{policy}/rollback")
    async def rollback(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        await policy_of(tenant, policy)
        req = await body(request, RollbackBody)
        fields = req.model_dump()
        fields["reason"] = fields["reason"] or "rollback"
        cmd = RollbackCommand(**fields, requested_by=f"key/{request.state.key_id}")
        return await move(tenant, policy, cmd)

    @router.post("/policies/{policy}/revisions/{revision}/tags")
    async def tag(request: Request, policy: str, revision: str) -> JSONResponse:
        tenant = await tenant_of(request)
        await policy_of(tenant, policy)
        if not (revision.isdigit() and len(revision) < 10 and int(revision) >= 1):
            raise BadRequest(
                f"revision {revision[:20]!r} must be a number from 1", param="revision"
            )
        req = await body(request, TagBody)
        cmd = TagCommand(
            revision=int(revision), **req.model_dump(), requested_by=f"key/{request.state.key_id}"
        )
        return await move(tenant, policy, cmd)

    @router.post("/policies/{policy}/retire")
    async def retire(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        await policy_of(tenant, policy)
        req = await body(request, RetireBody)
        cmd = RetireCommand(
            retired=not req.undo, reason=req.reason, requested_by=f"key/{request.state.key_id}"
        )
        return await move(tenant, policy, cmd)

    @router.get("/policies/{policy}/canary")
    async def canary(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        await policy_of(tenant, policy)
        view = await asyncio.to_thread(canary_view, repo(), tenant, policy)
        return JSONResponse({"object": "canary", "policy": policy, "view": view})

    @router.put("/policies/{policy}/lifecycle")
    async def configure(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        row = await policy_of(tenant, policy)
        req = await body(request, LifecycleBody)
        if commands is None:
            raise Unavailable("this gateway serves no lifecycle commands", code="not_served")
        cfg = PolicyConfigured(
            base_model=row.base_model, requested_by=f"key/{request.state.key_id}", **dict(req)
        )
        env = make_event(cfg, tenant=tenant, policy=policy, producer=gw.producer_name)
        await commands.publish(env)
        log.info("policy configured", policy=env.policy_id, suite=req.suite)
        out = {"policy": policy, "event_id": str(env.event_id), **req.model_dump(mode="json")}
        return JSONResponse(out, status_code=202)

    return router

"""A tenant's own policies over HTTP (``/mint/v1/...``), so a tenant needs only its API key:

- ``GET  /mint/v1/policies``: the caller's policies;
- ``GET  /mint/v1/policies/{policy}/revisions?limit=N``: its revisions, newest first;
- ``GET  /mint/v1/policies/{policy}/aliases``: where its aliases point;
- ``POST /mint/v1/policies/{policy}/promote`` ``{alias, revision, expected_revision?, reason?}``;
- ``POST /mint/v1/policies/{policy}/rollback`` ``{alias, to_revision?, expected_revision?,
  reason?}``.

Tenancy by construction: the tenant is the key's, the path names a policy of it, and another
tenant's policy is the same 404 as a missing one. Moves take the operators' path: a
PromoteCommand / RollbackCommand on ``serving.commands``, answered by the controller (the only
writer of aliases) with ``alias.moved`` (200) or ``serving.refused`` (409); no answer in time is
a 504 that says the command stays queued. Training over HTTP is the Tinker API (``/api/v1``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from catalog.exceptions import InvalidReference, NotFound
from catalog.refs import check_alias, check_name
from gateway.api import parse_json
from gateway.errors import ApiError, BadRequest, Unavailable
from schemas.envelope import Envelope, make_event
from schemas.events import PromoteCommand, RollbackCommand
from schemas.exceptions import SchemaError
from schemas.registry import decode_event, encode_event
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
ANSWERS = ("alias.moved", "serving.refused")


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


class MoveTimeout(ApiError):
    """504: sent, but the controller did not answer in time (never retried blindly)."""

    status, type, code = 504, "server_error", "controller_timeout"


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


class RollbackBody(AliasBody):
    to_revision: int | None = Field(None, ge=1)
    expected_revision: int | None = Field(None, ge=1)
    reason: str = Field("", max_length=1024)


class Commands(Protocol):
    """Serving commands and their answers (KafkaCommands, or a fake in unit tests)."""

    def start(self) -> None: ...
    def close(self) -> None: ...
    async def send(self, env: Envelope[Any], timeout_s: float) -> Envelope[Any]: ...


class KafkaCommands:
    """Publishes serving commands and follows ``serving.events`` (every partition from its end,
    no consumer group, positioned before any command is sent) for the answer whose
    ``causation_id`` is the command's id."""

    def __init__(self, settings: MintSettings, instance_id: str, retry_after_s: int = 5) -> None:
        from streams.topics import topic_for

        self.settings, self.instance_id, self.retry_after_s = settings, instance_id, retry_after_s
        self.commands = topic_for(settings, "serving.commands")
        self.events = topic_for(settings, "serving.events")
        self._pending: dict[uuid.UUID, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower: Any = None
        self._producer: Any = None

    def start(self) -> None:
        from streams.clients import make_producer
        from streams.follower import Follower
        from streams.topics import ensure_topics

        ensure_topics(self.settings, ["serving.commands", "serving.events"])
        self._producer = make_producer(
            self.settings, client_id=f"{self.instance_id}-commands", linger_ms=0, max_block_ms=5000
        )
        follower = Follower(
            self.settings, client_id=f"{self.instance_id}-serving", fetch_max_wait_ms=100
        )
        follower.assign(follower.partitions(self.events), "end")
        self._follower = follower
        self._thread = threading.Thread(target=self._run, name="lifecycle-answers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for records in self._follower.follow(self._stop, timeout_ms=200, retry_errors=True):
            for record in records:
                if not self._pending or not record.value:
                    continue
                try:
                    env = decode_event(record.value)
                except SchemaError:
                    continue
                with self._lock:
                    waiting = self._pending.get(env.causation_id) if env.type in ANSWERS else None
                if waiting is not None:
                    loop, fut = waiting
                    loop.call_soon_threadsafe(lambda f=fut, e=env: f.done() or f.set_result(e))

    async def send(self, env: Envelope[Any], timeout_s: float) -> Envelope[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        with self._lock:
            self._pending[env.event_id] = (loop, fut)
        try:
            try:
                sent = self._producer.send(self.commands, encode_event(env), env.key)
                await asyncio.wait_for(asyncio.wrap_future(_as_future(sent)), 10)
            except Exception as e:  # the broker did not take it: nothing was asked
                raise Unavailable(
                    f"the command could not be queued ({type(e).__name__}); nothing was sent, "
                    "retry shortly",
                    code="commands_unavailable",
                    headers={"Retry-After": str(self.retry_after_s)},
                ) from e
            try:
                return await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                raise MoveTimeout(
                    f"the controller did not answer within {timeout_s:g} s; the command stays "
                    "queued and is carried out when the controller runs: check "
                    f"GET {PREFIX}/policies/{{policy}}/aliases before sending it again"
                ) from None
        finally:
            with self._lock:
                self._pending.pop(env.event_id, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._follower is not None:
            self._follower.close()
        if self._producer is not None:
            self._producer.close(timeout=5)


def _as_future(sent: Any):
    """kafka-python's FutureRecordMetadata as a concurrent.futures.Future."""
    from concurrent.futures import Future

    out: Future = Future()
    sent.add_callback(lambda meta: out.done() or out.set_result(meta))
    sent.add_errback(lambda e: out.done() or out.set_exception(e))
    return out


def _validated(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate(parse_json(raw) if raw.strip() else {})
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        raise BadRequest(f"{where}: {err['msg']}", param=where) from e


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _commands_of(gw: Gateway) -> Commands | None:
    """The gateway's serving commands: set by tests (``gw.lifecycle_commands``), else on the
    engines' Kafka settings; None where the gateway has no Kafka (moves answer 503)."""
    given = getattr(gw, "lifecycle_commands", None)
    if given is not None:
        return given
    settings = getattr(gw.engines, "settings", None)
    if isinstance(settings, MintSettings):
        return KafkaCommands(settings, gw.config.instance_id, gw.config.retry_after_s)
    return None


def build_router(gw: Gateway) -> APIRouter:
    commands = _commands_of(gw)

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
        from gateway.app import read_body  # the app module imports this one

        return _validated(model, await read_body(request, MAX_BODY_BYTES))

    async def move(tenant: str, policy: str, payload: Any) -> JSONResponse:
        if commands is None:
            raise Unavailable("this gateway serves no lifecycle commands", code="not_served")
        env = make_event(payload, tenant=tenant, policy=policy, producer=gw.producer_name)
        answer = await commands.send(env, MOVE_TIMEOUT_S)
        p = answer.payload
        log.info("alias command answered", policy=env.policy_id, type=answer.type, alias=p.alias)
        if answer.type == "serving.refused":
            raise MoveRefused(
                f"{env.type} of {policy}@{p.alias} refused: {p.reason}", p.current_revision
            )
        return JSONResponse(
            {
                "policy": policy,
                "alias": p.alias,
                "from_revision": p.from_revision,
                "to_revision": p.to_revision,
                "cause": p.cause,
                "event_id": str(answer.event_id),
            }
        )

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
        data = [
            {
                "revision": r.revision,
                "digest": r.digest,
                "parent_revision": r.parent_revision,
                "base_model": r.base_model,
                "created_at": _iso(r.created_at),
                "created_by": r.created_by,
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
        by = f"key/{request.state.key_id}"
        cmd = PromoteCommand(**req.model_dump(), requested_by=by)
        return await move(tenant, policy, cmd)

    @router.post("/policies/{policy}/rollback")
    async def rollback(request: Request, policy: str) -> JSONResponse:
        tenant = await tenant_of(request)
        await policy_of(tenant, policy)
        req = await body(request, RollbackBody)
        fields = req.model_dump()
        fields["reason"] = fields["reason"] or "rollback"
        cmd = RollbackCommand(**fields, requested_by=f"key/{request.state.key_id}")
        return await move(tenant, policy, cmd)

    return router

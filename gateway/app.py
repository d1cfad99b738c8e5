"""The HTTP surface: OpenAI's ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``,
plus ``/healthz`` and ``/metrics``. Stateless: every instance answers every request the same.

A request: bearer key → tenant (401) → the tenant's token bucket (429) → the body, read up to
``max_body_bytes`` (400) → validated (400, naming the field) → the model in the caller's tenant
(404, the same for another tenant's) → one ``infer.requested`` per choice → answers within
``answer_timeout_s`` (else 503 with Retry-After) → JSON, or server-sent events for ``stream``.
The request's correlation id is bound to every log line while it is handled and returned in
``x-mint-correlation-id``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from catalog.exceptions import CatalogUnavailable
from gateway import responses
from gateway.api import ChatRequest, CompletionRequest, parse_json, validate
from gateway.errors import ApiError, BadRequest, Unavailable
from gateway.metrics import GatewayMetrics
from gateway.refs import parse_model
from gateway.service import Gateway
from schemas.events import ChatTurn, InferRequested
from schemas.logs import bound_event

log = structlog.get_logger()
ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/metrics"}
OPENAI_TEMPERATURE = 1.0  # OpenAI's default when a request names none (the engine's is 0)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused past ``limit`` bytes without reading more than that."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the request body is {declared} bytes; this gateway takes at most "
                         f"{limit}", code="request_too_large")  # fmt: skip
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the request body is over {limit} bytes, this gateway's limit",
                             code="request_too_large")  # fmt: skip
        chunks.append(chunk)
    return b"".join(chunks)


def _chat_payloads(req: ChatRequest, ids: list[str], alias: str, revision: int | None,
                   max_tokens: int, expires_at: datetime) -> list[InferRequested]:  # fmt: skip
    turns = [ChatTurn(role="system" if m.role == "developer" else m.role, content=m.text())
             for m in req.messages]  # fmt: skip
    last_user = next(m.text() for m in reversed(req.messages) if m.role == "user" and m.text())
    return [InferRequested(
        request_id=rid, alias=alias, revision=revision, prompt=last_user, max_tokens=max_tokens,
        temperature=OPENAI_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=None if req.seed is None else req.seed + i, stop=req.stops(), chat=True,
        messages=turns, logprobs=bool(req.logprobs), expires_at=expires_at,
    ) for i, rid in enumerate(ids)]  # fmt: skip


def _completion_payloads(req: CompletionRequest, ids: list[str], alias: str,
                         revision: int | None, max_tokens: int,
                         expires_at: datetime) -> list[InferRequested]:  # fmt: skip
    out = []
    for k, prompt in enumerate(req.prompts()):
        for i in range(req.n):
            out.append(InferRequested(
                request_id=ids[k * req.n + i], alias=alias, revision=revision, prompt=prompt,
                max_tokens=max_tokens,
                temperature=OPENAI_TEMPERATURE if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                seed=None if req.seed is None else req.seed + i, stop=req.stops(),
                logprobs=req.logprobs is not None, expires_at=expires_at,
            ))  # fmt: skip
    return out


async def _sse(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, str]]:
    for chunk in chunks:
        yield {"data": json.dumps(chunk, separators=(",", ":"))}
    yield {"data": "[DONE]"}


class Measure:
    """Counts and times every HTTP request by route and status (a plain ASGI middleware: no
    extra task or stream per request, unlike ``@app.middleware``)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        t0 = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.metrics.http_seconds.labels(route).observe(time.perf_counter() - t0)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.http_requests.labels(route, str(status)).inc()


def create_app(gw: Gateway) -> FastAPI:
    cfg, metrics = gw.config, gw.metrics

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(gw.start)  # follow the answers before taking any request
        log.info("gateway ready", instance=cfg.instance_id, host=cfg.host, port=cfg.port)
        try:
            yield
        finally:
            await run_in_threadpool(gw.close)

    app = FastAPI(title="MinT gateway", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)  # fmt: skip
    app.state.gateway = gw

    app.add_middleware(Measure, metrics=metrics)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(CatalogUnavailable)
    async def catalog_down(_request: Request, e: CatalogUnavailable) -> JSONResponse:
        log.warning("catalog unavailable", error=str(e)[:300])
        err = Unavailable("the catalog is unavailable; retry shortly", code="catalog_unavailable",
                          headers={"Retry-After": str(cfg.retry_after_s)})  # fmt: skip
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": {"message": str(e.detail), "type": "invalid_request_error",
                                       "param": None, "code": None}},
                            status_code=e.status_code, headers=e.headers)  # fmt: skip

    async def infer(request: Request, chat: bool) -> Response:
        caller = await gw.authenticate(request.headers.get("authorization"))
        await gw.admit(caller.tenant)
        body = parse_json(await read_body(request, cfg.max_body_bytes))
        req: ChatRequest | CompletionRequest = validate(
            ChatRequest if chat else CompletionRequest, body, cfg
        )  # fmt: skip
        ref = parse_model(req.model, caller.tenant)
        alias, revision = await gw.target(ref, req.model)
        correlation_id = uuid.uuid4()
        with bound_event(correlation_id=str(correlation_id), tenant=caller.tenant,
                         policy=ref.policy, model=req.model, key_id=caller.key_id):  # fmt: skip
            per_prompt = req.n  # choices per prompt
            # Past the answer timeout the caller has its 503: engines then skip the request.
            expires_at = datetime.now(UTC) + timedelta(seconds=cfg.answer_timeout_s)
            if isinstance(req, ChatRequest):
                base, ids = gw.request_ids(req.n)
                payloads = _chat_payloads(req, ids, alias, revision, req.limit(cfg), expires_at)
            else:
                base, ids = gw.request_ids(req.n * len(req.prompts()))
                payloads = _completion_payloads(req, ids, alias, revision, req.limit(cfg),
                                                expires_at)  # fmt: skip
            t0 = time.perf_counter()
            try:
                done = await gw.run(ref, req.model, payloads, correlation_id)
            except ApiError as e:
                log.info("request refused", status=e.status, code=e.code, error=e.message[:200])
                raise
            log.info("request answered", choices=len(done), revision=done[0].revision,
                     ms=round((time.perf_counter() - t0) * 1000, 1), stream=req.stream)  # fmt: skip
        headers = responses.revision_headers(done, ref)
        headers["x-mint-correlation-id"] = str(correlation_id)
        created = int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if chat:
            rid = f"chatcmpl-{base}"
            if req.stream:
                chunks = responses.chat_chunks(rid, created, req.model, done, per_prompt,
                                               include_usage)  # fmt: skip
                return EventSourceResponse(_sse(chunks), headers=headers, ping=15)
            return JSONResponse(responses.chat_completion(rid, created, req.model, done,
                                                          per_prompt), headers=headers)  # fmt: skip
        rid = f"cmpl-{base}"
        if req.stream:
            chunks = responses.completion_chunks(rid, created, req.model, done, per_prompt,
                                                 include_usage)  # fmt: skip
            return EventSourceResponse(_sse(chunks), headers=headers, ping=15)
        return JSONResponse(responses.completion(rid, created, req.model, done, per_prompt),
                            headers=headers)  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await infer(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await infer(request, chat=False)

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        caller = await gw.authenticate(request.headers.get("authorization"))
        await gw.admit(caller.tenant)
        found = await gw.models(caller.tenant)
        return JSONResponse({"object": "list", "data": [
            {"id": m.id, "object": "model", "owned_by": caller.tenant,
             "created": int(m.created.timestamp()) if m.created else 0} for m in found]})  # fmt: skip

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        ok = gw.engines.healthy
        return JSONResponse({"status": "ok" if ok else "answers not followed",
                             "instance": cfg.instance_id}, status_code=200 if ok else 503)  # fmt: skip

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app

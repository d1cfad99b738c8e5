"""The HTTP surface: OpenAI's ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``,
plus ``/healthz`` and ``/metrics``. Stateless: every instance answers every request the same.

A request: bearer key → tenant (401) → the tenant's token bucket (429) → the body, read up to
``max_body_bytes`` (400) → validated (400, naming the field) → the model in the caller's tenant
(404, the same for another tenant's) → one ``infer.requested`` per prompt (with its ``n``
choices) → answers within ``answer_timeout_s`` (else 503 with Retry-After) → JSON; or, for
``stream``, server-sent events from the first event of every request on (gateway.streaming).
The request's correlation id is bound to every log line while it is handled and returned in
``x-mint-correlation-id``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from catalog.exceptions import CatalogUnavailable
from catalog.refs import Ref
from gateway import asks, responses, streaming
from gateway.api import ignored_fields, parse_json, validate
from gateway.bodies import ChatRequest, CompletionRequest
from gateway.deltas import Answers
from gateway.errors import ApiError, Unavailable
from gateway.feedback import build_router as feedback_router
from gateway.ids import sticky_caller
from gateway.lifecycle import build_router as lifecycle_router
from gateway.metrics import GatewayMetrics
from gateway.refs import parse_model
from gateway.requests import client_of, read_body
from gateway.service import Gateway
from gateway.tinker.router import build_router
from gateway.tinker.service import TinkerApi
from gateway.tokenize_routes import build_router as tokenize_router
from gateway.tools import check_tool_choice
from schemas.envelope import Envelope
from schemas.logs import bound_event

log = structlog.get_logger()
ROUTES = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/feedback",
    "/tokenize",
    "/detokenize",
    "/version",
    "/healthz",
    "/metrics",
}
VLLM_VERSION = "0.32.0"  # the vllm serve whose API this gateway serves
# Routes with ids in their paths are counted by surface (a bounded label set).
ROUTE_PREFIXES = (("/api/v1/", "/api/v1 (tinker)"), ("/mint/v1/", "/mint/v1 (lifecycle)"))


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    return next((label for prefix, label in ROUTE_PREFIXES if path.startswith(prefix)), "other")


class Measure:
    """Counts and times every HTTP request by route and status (a plain ASGI middleware: no
    extra task or stream per request, unlike ``@app.middleware``)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_label(scope["path"])
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

    app = FastAPI(
        title="MinT gateway",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = gw

    app.add_middleware(Measure, metrics=metrics)
    if gw.tinker is not None:  # the Tinker SDK's /api/v1 (gateway/tinker)
        # typed in gateway.service by what the gateway needs of it (start, close) only
        app.include_router(build_router(cast(TinkerApi, gw.tinker)))
    app.include_router(lifecycle_router(gw))  # /mint/v1: a tenant's own policies
    app.include_router(feedback_router(gw))  # /v1/feedback: scores of answers (canaries)
    app.include_router(tokenize_router(gw))  # /tokenize, /detokenize as vllm serve

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(CatalogUnavailable)
    async def catalog_down(_request: Request, e: CatalogUnavailable) -> JSONResponse:
        log.warning("catalog unavailable", error=str(e)[:300])
        err = Unavailable(
            "the catalog is unavailable; retry shortly",
            code="catalog_unavailable",
            headers={"Retry-After": str(cfg.retry_after_s)},
        )
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, e: Exception) -> JSONResponse:
        # A bug of ours, never the caller's input (that is a 400 above): still OpenAI's shape,
        # so a client reads an error rather than failing to parse plain text.
        log.exception("request failed unexpectedly", error=f"{type(e).__name__}: {e}"[:300])
        err = ApiError(
            "the gateway failed to handle this request; retry, and tell the "
            "operators if it persists",
            code="internal_error",
        )
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {
                "error": {
                    "message": str(e.detail),
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
            status_code=e.status_code,
            headers=e.headers,
        )

    async def infer(request: Request, chat: bool) -> Response:
        caller = await gw.authenticate(request.headers.get("authorization"), client_of(request))
        await gw.admit(caller.tenant)
        body = parse_json(await read_body(request, cfg.max_body_bytes))
        req: ChatRequest | CompletionRequest = validate(
            ChatRequest if chat else CompletionRequest, body, cfg
        )
        ref = parse_model(req.model, caller.tenant)
        alias, revision = await gw.target(ref, req.model)
        if isinstance(req, ChatRequest):
            check_tool_choice(req, gw.tools)
        # the base model's tokenizer, when this request can use it and this gateway has it
        tokenizer = (
            await gw.tokenizer(ref, req.model, required=False) if asks.uses_tokenizer(req) else None
        )
        correlation_id = uuid.uuid4()
        with bound_event(
            correlation_id=str(correlation_id),
            tenant=caller.tenant,
            policy=ref.policy,
            model=req.model,
            key_id=caller.key_id,
        ):
            # Past the answer timeout the caller has its 503: engines then skip the request.
            expires_at = datetime.now(UTC) + timedelta(seconds=cfg.answer_timeout_s)
            prompts = 1 if isinstance(req, ChatRequest) else len(req.prompts())
            base, ids = gw.request_ids(prompts)
            common = {
                "alias": alias,
                "revision": revision,
                "expires_at": expires_at,
                # deltas keyed by this instance's id: it follows only that partition
                "stream_to": cfg.instance_id if req.stream else None,
                # a canary's sticky routing key: the same end user (or key) gets the same side
                "caller": sticky_caller(req.user, caller.key_id),
            }
            ask = asks.build(
                req,
                ids,
                common,
                default_max_tokens=cfg.default_max_tokens,
                tools=gw.tools,
                tokenizer=tokenizer,
            )
            # vllm serve names the response after the request's request_id when it sends one
            stem = req.request_id or base
            rid = f"chatcmpl-{stem}" if chat else f"cmpl-{stem}"
            created = int(time.time())
            t0 = time.perf_counter()
            try:
                if req.stream:
                    answers, first = await gw.stream(ref, req.model, ask.payloads, correlation_id)
                else:
                    done = await gw.run(ref, req.model, ask.payloads, correlation_id)
            except ApiError as e:
                log.info("request refused", status=e.status, code=e.code, error=e.message[:200])
                raise
            ms = round((time.perf_counter() - t0) * 1000, 1)
            if req.stream:
                log.info("stream started", prompts=prompts, n=ask.n, ms_to_first_event=ms)
            else:
                log.info(
                    "request answered", prompts=prompts, n=ask.n, revision=done[0].revision, ms=ms
                )
        ignored = ",".join(ignored_fields(req))[:1000]
        extra = {"x-mint-ignored-fields": ignored} if ignored else {}
        if req.stream:
            return _stream_response(ask, rid, created, ref, answers, first, correlation_id, extra)
        headers = {**responses.revision_headers(done, ref), **extra}
        headers["x-mint-correlation-id"] = str(correlation_id)
        headers["x-mint-request-id"] = ids[0]  # prompt k's: the same with .k at the end
        return JSONResponse(responses.response(ask, rid, created, req.model, done), headers=headers)

    def _stream_response(
        ask: asks.Ask,
        rid: str,
        created: int,
        ref: Ref,
        answers: Answers,
        first: list[tuple[int, Envelope[Any]]],
        correlation_id: uuid.UUID,
        extra: dict[str, str],
    ) -> Response:
        """The SSE response of a stream whose first events were read (headers: what they say:
        the revisions generating; the adapter digest comes as the chunks' fingerprint)."""
        req = ask.req
        chunks = streaming.StreamChunks(
            ask=ask,
            rid=rid,
            created=created,
            model=req.model,
            prompts=len(answers.envs),
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
        )
        events = streaming.sse(
            answers,
            first,
            chunks,
            retry_after_s=cfg.retry_after_s,
            prompt_param="messages" if ask.chat else "prompt",
            log_fields={"correlation_id": str(correlation_id), "tenant": ref.tenant},
            on_answered=lambda done: gw.streamed(done, answers.started),
        )

        async def client_gone(_message: Message) -> None:
            answers.close()  # cancels the requests still generating

        headers = {
            "x-mint-revision": ",".join(
                dict.fromkeys(str(env.payload.revision) for _, env in first)
            ),
            "x-mint-policy": f"{ref.tenant}/{ref.policy}",
            "x-mint-correlation-id": str(correlation_id),
            "x-mint-request-id": ask.payloads[0].request_id,  # what POST /v1/feedback scores
            **extra,
        }
        return EventSourceResponse(
            events, headers=headers, ping=15, client_close_handler_callable=client_gone
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await infer(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await infer(request, chat=False)

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        caller = await gw.authenticate(request.headers.get("authorization"), client_of(request))
        await gw.admit(caller.tenant)
        found = await gw.models(caller.tenant)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": m.id,
                        "object": "model",
                        "owned_by": caller.tenant,
                        "created": int(m.created.timestamp()) if m.created else 0,
                    }
                    for m in found
                ],
            }
        )

    @app.get("/version")
    async def version() -> JSONResponse:
        """vllm serve's /version: the vLLM version whose API this gateway serves."""
        return JSONResponse({"version": VLLM_VERSION})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        ok = gw.engines.healthy
        return JSONResponse(
            {"status": "ok" if ok else "answers not followed", "instance": cfg.instance_id},
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app

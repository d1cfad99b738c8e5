"""The Tinker HTTP API (``/api/v1/...``) as the official ``tinker`` SDK 0.38.0 calls it.

Point the SDK at the gateway: ``TINKER_BASE_URL=<gateway url>`` and
``TINKER_API_KEY=tml-<MinT key>`` (the SDK refuses a key without its ``tml-`` prefix; the gateway
takes the prefix off and checks the MinT key as ``Authorization: Bearer`` would). The client
config this API hands out keeps the SDK on plain keys (no JWT exchange), on
``/api/v1/retrieve_future`` polling, and splits ``forward_backward`` batches into calls within
the step contract's bounds.

Calls MinT does not serve (custom losses, copy or external weights, the REST catalog of runs and
checkpoints, ...) answer 400 naming the call.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from gateway.api import parse_json
from gateway.auth import Caller
from gateway.errors import ApiError, BadRequest, RequestTooLarge, Unavailable
from gateway.requests import read_body
from gateway.tinker import bodies as b
from gateway.tinker.calls import CallKey
from gateway.tinker.futures import Done, Failed
from gateway.tinker.service import TinkerApi
from gateway.tinker.wire import WireError, decode_forward_backward
from schemas.events.steps import MAX_STEP_DATUMS, MAX_STEP_TOKENS

M = TypeVar("M", bound=BaseModel)
KEY_PREFIX = "tml-"
MAX_BODY_BYTES = 1024 * 1024  # the JSON calls: a 32k-token prompt is about 200 KiB of JSON
# What the SDK estimates per position of a cross_entropy datum (int32 token, int64 target,
# float32 weight): chunks of at most this many bytes stay within MAX_STEP_TOKENS per call.
BYTES_PER_POSITION = 16
# A forward_backward body: the SDK sends chunks of at most MAX_STEP_TOKENS * BYTES_PER_POSITION
# (256 KiB) of tokens and tensor bytes (client_config below), plus a few dozen bytes of protobuf
# per datum and tensor (about 100 KiB more at MAX_STEP_DATUMS datums); a datum larger than a
# chunk travels alone, and one within MAX_STEP_TOKENS fits with up to 7 int64 inputs. Anything
# past this is refused unread (413), and what is taken is decoded off the event loop.
MAX_FWDBWD_BODY_BYTES = 1024 * 1024
PROTOBUF = "application/x-protobuf"


class BodyTooLarge(ApiError):
    """413: the body is over the call's limit (the SDK does not retry it)."""

    status, type, code = 413, "invalid_request_error", "request_too_large"


def client_config() -> dict[str, Any]:
    """The SDK's feature flags for this server (tinker.types.ClientConfigResponse)."""
    return {
        "pjwt_auth_enabled": False,  # plain API keys on every call, no /auth/token exchange
        "credential_default_source": "api_key",
        "parallel_fwdbwd_chunks": True,
        "proto_compress_fwdbwd": False,
        "fwdbwd_max_chunk_len": MAX_STEP_DATUMS,
        "fwdbwd_max_chunk_bytes_count": MAX_STEP_TOKENS * BYTES_PER_POSITION,
        "sample_use_retrieve_futures": False,
        "custom_loss_server_side": False,
        "sample_join_sampling_session": False,
        "use_pyqwest_transport": True,
    }


def _validated(model: type[M], raw: bytes) -> M:
    body = parse_json(raw)
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        raise BadRequest(f"{where}: {err['msg']}", param=where) from e


def build_router(api: TinkerApi) -> APIRouter:
    gw = api.gw
    router = APIRouter(prefix="/api/v1")

    async def caller(request: Request, *, admit: bool = False) -> Caller:
        key = request.headers.get("x-api-key", "")
        header = request.headers.get("authorization")
        if key:
            header = f"Bearer {key.removeprefix(KEY_PREFIX)}"
        client = request.client.host if request.client else None
        who = await gw.authenticate(header, client)
        if admit:  # calls that make work; polls, heartbeats and telemetry do not
            await gw.admit(who.tenant)
        return who

    async def body(request: Request) -> bytes:
        return await read_body(request, MAX_BODY_BYTES)

    async def proto_body(request: Request) -> bytes:
        try:
            return await read_body(request, MAX_FWDBWD_BODY_BYTES)
        except RequestTooLarge as e:  # a 413 here: the SDK does not retry it
            raise BodyTooLarge(
                f"forward_backward: {e.message} ({MAX_FWDBWD_BODY_BYTES // 1024} KiB per call). "
                "The SDK splits a batch into calls of at most "
                f"{client_config()['fwdbwd_max_chunk_bytes_count'] // 1024} KiB of tokens and "
                "tensors, as this server's client config says: send fewer or shorter datums "
                "per call",
                param="data",
            ) from e

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        if not api.healthy:
            raise Unavailable("training answers are not followed", code="trainer_unavailable")
        return JSONResponse({"status": "ok"})

    @router.post("/client/config")
    async def config(request: Request) -> JSONResponse:
        await caller(request)
        return JSONResponse(client_config())

    @router.post("/client/dynamic_config")
    async def dynamic_config(request: Request) -> JSONResponse:
        await caller(request)
        return JSONResponse({"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    @router.post("/telemetry")
    async def telemetry(request: Request) -> JSONResponse:
        await caller(request)  # accepted and dropped: MinT has its own logs and metrics
        return JSONResponse({"status": "accepted"})

    @router.get("/get_server_capabilities")
    async def capabilities(request: Request) -> JSONResponse:
        await caller(request)
        return JSONResponse(api.capabilities())

    @router.post("/create_session")
    async def create_session(request: Request) -> JSONResponse:
        await caller(request)
        _validated(b.CreateSessionRequest, await body(request))
        return JSONResponse({"type": "create_session", "session_id": api.new_session()})

    @router.post("/session_heartbeat")
    async def heartbeat(request: Request) -> JSONResponse:
        await caller(request)
        _validated(b.SessionHeartbeatRequest, await body(request))
        return JSONResponse({"type": "session_heartbeat"})

    @router.post("/sessions/{session_id}/finish")
    async def finish_session(request: Request, session_id: str) -> JSONResponse:
        await caller(request)
        return JSONResponse({})

    @router.post("/create_model")
    async def create_model(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        req = _validated(b.CreateModelRequest, await body(request))
        return JSONResponse(await api.create_model(who.tenant, req, _call(request, None)))

    @router.post("/get_info")
    async def get_info(request: Request) -> JSONResponse:
        who = await caller(request)
        req = _validated(b.ModelRequest, await body(request))
        return JSONResponse(api.info(await api.model(who.tenant, req.model_id)))

    @router.post("/forward_backward")
    async def forward_backward(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        if request.headers.get("content-encoding", "identity") != "identity":
            raise BadRequest(
                "forward_backward: compressed bodies are not taken; this server's client "
                "config sets proto_compress_fwdbwd false",
                code="unsupported_parameter",
            )
        if PROTOBUF not in request.headers.get("content-type", ""):
            raise BadRequest(f"forward_backward takes a {PROTOBUF} body (the SDK's encoding)")
        raw = await proto_body(request)
        try:  # a thread: decoding a large body would hold every other caller back
            req = await asyncio.to_thread(decode_forward_backward, raw)
        except WireError as e:
            raise BadRequest(f"forward_backward: {e}", param="data") from e
        return JSONResponse(await api.forward_backward(who.tenant, req, _call(request, req.seq_id)))

    @router.post("/optim_step")
    async def optim_step(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        req = _validated(b.OptimStepRequest, await body(request))
        return JSONResponse(await api.optim_step(who.tenant, req, _call(request, req.seq_id)))

    @router.post("/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        req = _validated(b.SaveWeightsForSamplerRequest, await body(request))
        return JSONResponse(await api.save_for_sampler(who.tenant, req, _call(request, req.seq_id)))

    @router.post("/save_weights")
    async def save_weights(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        req = _validated(b.SaveWeightsRequest, await body(request))
        return JSONResponse(await api.save_state(who.tenant, req, _call(request, req.seq_id)))

    @router.post("/load_weights")
    async def load_weights(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        req = _validated(b.LoadWeightsRequest, await body(request))
        return JSONResponse(await api.load_state(who.tenant, req, _call(request, req.seq_id)))

    @router.post("/create_sampling_session")
    async def create_sampling_session(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        req = _validated(b.CreateSamplingSessionRequest, await body(request))
        sid = await api.sampling_session(who.tenant, req.model_path)
        return JSONResponse({"type": "create_sampling_session", "sampling_session_id": sid})

    @router.get("/samplers/{sampler_id}")
    async def sampler(request: Request, sampler_id: str) -> JSONResponse:
        await caller(request)
        return JSONResponse(api.sampler(sampler_id))

    @router.post("/asample")
    async def asample(request: Request) -> JSONResponse:
        who = await caller(request, admit=True)
        req = _validated(b.SampleRequest, await body(request))
        return JSONResponse(await api.sample(who.tenant, req, _call(request, req.seq_id)))

    @router.post("/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        who = await caller(request)
        req = _validated(b.FutureRetrieveRequest, await body(request))
        outcome = await api.retrieve(who.tenant, req.request_id)
        if outcome is None:  # still running: the SDK asks again at once
            return JSONResponse(
                {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
            )
        if isinstance(outcome, Failed):
            return JSONResponse({"error": outcome.message, "category": outcome.category})
        assert isinstance(outcome, Done)
        if outcome.proto is not None:
            return Response(outcome.proto, media_type=PROTOBUF)
        return JSONResponse(outcome.json)

    @router.api_route("/{call:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unsupported(request: Request, call: str) -> JSONResponse:
        await caller(request)
        raise BadRequest(
            f"{call[:100]} is not supported by MinT's Tinker API (it serves LoRA training on "
            "this deployment's base model: create_model, forward, forward_backward, "
            "optim_step, save_weights_for_sampler, save_state/load_state, and sampling)",
            code="unsupported_call",
        )

    return router


def _call(request: Request, seq_id: int | None) -> CallKey | None:
    """The call's identity across the SDK's re-sends (its idempotency key header)."""
    return CallKey.of(request.headers.get("x-idempotency-key"), seq_id)

"""The Tinker API's calls on one gateway instance: each training call becomes one
``train.step.requested`` (tenant: the API key's; policy: the model's) and a future; sampling runs
on the engines the OpenAI surface uses (gateway.service.Gateway.run) with token prompts.

Tenancy by construction: a ``model_id`` (``<session>:train:<n>``) names the policy
``<session>-<n>`` *of the caller's tenant*, and a sampler path or id names a policy the same way,
so another tenant's id can only point at a policy the caller does not have: the same 404 as a
missing one. Sessions and sampling sessions are stateless ids; what this instance remembers (the
models it created, saved states, futures) is a cache of what the trainer and catalog hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from catalog.refs import Ref
from gateway.errors import ApiError, ModelNotFound
from gateway.service import Gateway
from gateway.tinker import sampling, steps
from gateway.tinker.bodies import (
    MODEL_ID,
    CreateModelRequest,
    LoadWeightsRequest,
    OptimStepRequest,
    SampleRequest,
    SaveWeightsForSamplerRequest,
    SaveWeightsRequest,
)
from gateway.tinker.futures import Done, Entry, Failed, FuturesTable, Outcome
from gateway.tinker.trainer import Trainer
from gateway.tinker.wire import FwdBwdRequest
from schemas.envelope import make_event
from schemas.events import InferRequested
from schemas.events.steps import TrainStepCompleted, TrainStepRequested
from schemas.exceptions import EventValidationError

log = structlog.get_logger()
SAMPLER_PATH = re.compile(
    r"^tinker://(?P<policy>[a-z0-9][a-z0-9._-]{0,126})/sampler_weights/[^/@]*@(?P<rev>\d{1,9})$"
)
MAX_REMEMBERED = 100_000  # models and saved states this instance keeps in memory
V = TypeVar("V")
SAMPLER_ID = re.compile(r"^(?P<policy>[a-z0-9][a-z0-9._-]{0,126})@(?P<rev>\d{1,9})$")


@dataclass(frozen=True)
class Model:
    """A training model of a tenant: its policy and what create_model said about it."""

    model_id: str
    policy: str
    base_model: str
    rank: int | None = None
    train_attn: bool = True
    train_mlp: bool = True


def remember(table: dict[Any, V], key: Any, value: V) -> V:
    """``table[key] = value``, the oldest entry dropped past MAX_REMEMBERED (a cache: what is
    dropped is found again in the catalog, or answered by the trainer)."""
    table.pop(key, None)
    table[key] = value
    while len(table) > MAX_REMEMBERED:
        del table[next(iter(table))]
    return value


CALLS = uuid.UUID("6d696e74-7469-6e6b-6572-63616c6c7300")  # the namespace of call event ids


@dataclass(frozen=True)
class CallKey:
    """What makes a Tinker call the same call when the SDK sends it again: its idempotency key
    (``X-Idempotency-Key``, one per call and kept across the SDK's retries) with its ``seq_id``.
    The ``seq_id`` alone is not enough: it restarts at 1 in each training client of a model."""

    idempotency_key: str
    seq_id: int | None = None

    @classmethod
    def of(cls, idempotency_key: str | None, seq_id: int | None) -> CallKey | None:
        return cls(idempotency_key[:200], seq_id) if idempotency_key else None

    def event_id(self, tenant: str, model_id: str, op: str) -> uuid.UUID:
        """The command's event id: the same for every copy of the call, so the trainer (which
        answers an event id it has seen from memory) never applies it twice."""
        parts = (tenant, model_id, op, str(self.seq_id), self.idempotency_key)
        return uuid.uuid5(CALLS, "\x1f".join(parts))


def policy_of(model_id: str) -> str | None:
    found = MODEL_ID.match(model_id)
    return f"{found['session']}-{int(found['seq'])}" if found else None


class TinkerApi:
    def __init__(
        self,
        gw: Gateway,
        trainer: Trainer,
        base_models: list[str],
        *,
        futures: FuturesTable | None = None,
        max_context: int | None = None,
    ) -> None:
        self.gw, self.trainer = gw, trainer
        self.base_models = [b for b in base_models if b]
        self.max_context = max_context
        self.futures = futures if futures is not None else FuturesTable()
        self.futures.finish = self._finish
        self._models: dict[tuple[str, str], Model] = {}
        self._states: dict[tuple[str, str], str] = {}  # (tenant, tinker path) → store uri
        self._calls: dict[uuid.UUID, str] = {}  # a call's event id → its future's request id
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.trainer.start(self.futures)

    def close(self) -> None:
        """Stop following the trainer; samples still running are cancelled on their loop
        (close runs on a worker thread of the app's shutdown)."""
        for task in list(self._tasks):
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                task.get_loop().call_soon_threadsafe(task.cancel)
        self.trainer.close()

    @property
    def healthy(self) -> bool:
        return self.trainer.healthy

    # ------------------------------------------------------------------ sessions and models

    @staticmethod
    def new_session() -> str:
        return f"tk{secrets.token_hex(8)}"

    def capabilities(self) -> dict[str, Any]:
        return {
            "supported_models": [
                {
                    "model_name": b,
                    "max_context_length": self.max_context,
                    "trainable": True,
                    "sampleable": True,
                }
                for b in self.base_models
            ]
        }

    async def model(self, tenant: str, model_id: str | None) -> Model:
        """The caller's model, or ModelNotFound (missing, malformed, or another tenant's)."""
        policy = policy_of(model_id or "")
        if policy is None:
            raise ModelNotFound(str(model_id))
        found = self._models.get((tenant, policy))
        if found is not None:
            return found
        # Created through another instance (or before a restart): the catalog knows the policy.
        await self.gw.target(Ref(tenant, policy, alias="prod"), str(model_id))
        base = self.base_models[0] if self.base_models else ""
        return remember(self._models, (tenant, policy), Model(str(model_id), policy, base))

    def info(self, model: Model) -> dict[str, Any]:
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {
                "arch": None,
                "model_name": model.base_model,
                "tokenizer_id": model.base_model,
            },
            "is_lora": True,
            "lora_rank": model.rank,
            "model_name": model.base_model,
        }

    # ------------------------------------------------------------------ training calls

    def _request_id(self) -> str:
        return f"{self.gw.engines.request_prefix}tk{uuid.uuid4().hex[:20]}"

    async def _submit(
        self,
        tenant: str,
        model: Model,
        cmd: TrainStepRequested,
        call: CallKey | None = None,
        **context: Any,
    ) -> dict[str, Any]:
        """Register the future, publish the command (acked before the call returns, so the
        next call of this model is published after it), and answer the future's id.

        A re-sent call (``call``: the SDK's retry of it) answers the first one's future while
        that lives here and did not fail to be queued; otherwise it is published again under
        the same event id, which the trainer recognises and answers without running it twice.
        """
        event_id = call.event_id(tenant, model.model_id, cmd.op) if call else None
        if event_id is not None:
            first = self._calls.get(event_id)
            entry = self.futures.get(first, tenant) if first else None
            if entry is not None and not _unqueued(entry.outcome):
                log.info("tinker call re-sent", op=cmd.op, request_id=first)
                return {"request_id": first, "model_id": model.model_id}
        try:
            env = make_event(
                cmd,
                tenant=tenant,
                policy=model.policy,
                producer=self.gw.producer_name,
                event_id=event_id,
            )
        except EventValidationError as e:  # the envelope's rules (e.g. a store uri's namespace)
            raise steps.bad(f"{cmd.op}: {e}") from e
        self.futures.add(cmd.request_id, tenant, cmd.op, model_id=model.model_id, **context)
        if event_id is not None:
            remember(self._calls, event_id, cmd.request_id)
        try:
            await self.trainer.publish(env)
        except ApiError as e:
            self.futures.settle(cmd.request_id, Failed(e.message, "server", queued=False))
            raise
        log.info("tinker call queued", op=cmd.op, policy=model.policy, request_id=cmd.request_id)
        return {"request_id": cmd.request_id, "model_id": model.model_id}

    async def create_model(
        self, tenant: str, req: CreateModelRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        if req.base_model not in self.base_models:
            raise steps.bad(
                f"base_model {req.base_model!r} is not served here; this deployment trains "
                f"{', '.join(map(repr, self.base_models)) or 'no base model'}",
                "base_model",
            )
        if req.optimizer_config.type != "adamw":
            raise steps.bad(
                f"optimizer_config.type {req.optimizer_config.type!r}: MinT trains with adamw",
                "optimizer_config",
                "unsupported_parameter",
            )
        lora = steps.lora_spec(req.lora_config)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        policy = policy_of(model_id)
        assert policy is not None  # the body's patterns make a valid id
        assert req.lora_config is not None
        model = Model(
            model_id,
            policy,
            req.base_model,
            req.lora_config.rank,
            req.lora_config.train_attn,
            req.lora_config.train_mlp,
        )
        cmd = steps.step(
            self._request_id(), "create", req.base_model, lora=lora, seed=req.lora_config.seed
        )
        out = await self._submit(tenant, model, cmd, call)
        remember(self._models, (tenant, policy), model)
        return out

    async def forward_backward(
        self, tenant: str, req: FwdBwdRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        model = await self.model(tenant, req.model_id)
        op = "forward" if req.forward_only else "forward_backward"
        cmd = steps.step(
            self._request_id(),
            op,
            model.base_model,
            datums=steps.datums(req),
            loss_fn=req.loss_fn,
            loss_fn_config=req.loss_fn_config,
        )
        return await self._submit(tenant, model, cmd, call)

    async def optim_step(
        self, tenant: str, req: OptimStepRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        model = await self.model(tenant, req.model_id)
        adam = steps.adam_spec(req.adam_params, req.optimizer_params)
        cmd = steps.step(self._request_id(), "optim_step", model.base_model, adam=adam)
        return await self._submit(tenant, model, cmd, call)

    async def save_for_sampler(
        self, tenant: str, req: SaveWeightsForSamplerRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        model = await self.model(tenant, req.model_id)
        name = req.path or f"sampler-{req.sampling_session_seq_id or 0}-{_suffix(call, 3)}"
        cmd = steps.step(self._request_id(), "save_for_sampler", model.base_model, name=name)
        return await self._submit(
            tenant, model, cmd, call, policy=model.policy, name=name, session_only=req.path is None
        )

    async def save_state(
        self, tenant: str, req: SaveWeightsRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        model = await self.model(tenant, req.model_id)
        name = req.path or f"state-{_suffix(call, 4)}"
        cmd = steps.step(self._request_id(), "save_state", model.base_model, name=name)
        return await self._submit(tenant, model, cmd, call, policy=model.policy, name=name)

    async def load_state(
        self, tenant: str, req: LoadWeightsRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        if req.model_id is None:
            raise steps.bad(
                "load_weights without a model (create_training_client_from_state) is not "
                "supported: create a LoRA training client, then call load_state(path)",
                "model_id",
                "unsupported_parameter",
            )
        model = await self.model(tenant, req.model_id)
        source = self._states.get((tenant, req.path))
        if source is None:
            raise steps.bad(
                f"path {req.path!r} names no state saved through this gateway instance for "
                "your tenant: pass the path that save_state returned",
                "path",
            )
        cmd = steps.step(self._request_id(), "load_state", model.base_model, source_uri=source)
        return await self._submit(tenant, model, cmd, call, path=req.path)

    def _finish(self, entry: Entry, payload: Any) -> Outcome:
        outcome = steps.finish(entry, payload)
        if (
            isinstance(payload, TrainStepCompleted)
            and payload.op == "save_state"
            and payload.state_uri
            and isinstance(outcome, Done)
            and outcome.json
        ):
            remember(self._states, (entry.tenant, outcome.json["path"]), payload.state_uri)
        return outcome

    # ------------------------------------------------------------------ sampling

    async def sampling_session(self, tenant: str, model_path: str | None) -> str:
        """A sampling session on a saved sampler path (its policy and pinned revision)."""
        found = SAMPLER_PATH.match(model_path or "")
        if found is None:
            raise steps.bad(
                f"model_path {str(model_path)[:120]!r} is not a sampler path of this API "
                "(tinker://<policy>/sampler_weights/<name>@<revision>, as "
                "save_weights_for_sampler returns); sampling the bare base model is not "
                "supported",
                "model_path",
            )
        await self._check_policy(tenant, found["policy"], str(model_path))
        return steps.sampler_id(found["policy"], int(found["rev"]))

    async def _check_policy(self, tenant: str, policy: str, shown: str) -> None:
        """ModelNotFound unless the caller's tenant has the policy (made here, or in the
        catalog: gateway.service.Gateway.target, cached)."""
        if (tenant, policy) not in self._models:
            await self.gw.target(Ref(tenant, policy, alias="prod"), shown)

    def sampler(self, sampler: str) -> dict[str, Any]:
        found = SAMPLER_ID.match(sampler)
        if found is None:
            raise ModelNotFound(sampler)
        base = self.base_models[0] if self.base_models else ""
        return {"sampler_id": sampler, "base_model": base, "model_path": None}

    async def sample(self, tenant: str, req: SampleRequest) -> dict[str, Any]:
        sid = req.sampling_session_id
        if sid is None and req.model_path is not None:
            sid = await self.sampling_session(tenant, req.model_path)
        found = SAMPLER_ID.match(sid or "")
        if found is None:
            raise steps.bad(
                "asample needs a sampling_session_id (or model_path) of this API", "model_path"
            )
        policy, revision = found["policy"], int(found["rev"])
        await self._check_policy(tenant, policy, str(sid))
        request_id = self._request_id()
        payloads = sampling.infer_requests(req, revision, request_id, self.gw.config)
        self.futures.add(request_id, tenant, "sample")
        task = asyncio.create_task(
            self._run_sample(request_id, Ref(tenant, policy, revision=revision), payloads)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        ids = [f"{request_id}.{i}" for i in range(req.num_samples)]
        return {"request_id": request_id, "sample_sequence_ids": ids}

    async def _run_sample(self, request_id: str, ref: Ref, payloads: list[InferRequested]) -> None:
        try:
            shown = f"{ref.policy}@{payloads[0].revision}"
            done = await self.gw.run(ref, shown, payloads, uuid.uuid4())
            outcome: Outcome = Done(proto=sampling.sample_response(done))
        except ApiError as e:
            outcome = Failed(e.message, "user" if e.status < 500 else "server")
        except Exception as e:  # a bug of ours: the caller still hears of it
            log.exception("sampling failed", request_id=request_id)
            outcome = Failed(f"sampling failed: {type(e).__name__}", "server")
        self.futures.settle(request_id, outcome)

    # ------------------------------------------------------------------ futures

    async def retrieve(self, tenant: str, request_id: str) -> Outcome | None:
        entry = self.futures.get(request_id, tenant)
        if entry is None:
            raise FutureNotFound(request_id)
        return await self.futures.wait(entry)


def _unqueued(outcome: Outcome | None) -> bool:
    return isinstance(outcome, Failed) and not outcome.queued


def _suffix(call: CallKey | None, nbytes: int) -> str:
    """A default checkpoint name's random part: the same for each copy of one call."""
    if call is None:
        return secrets.token_hex(nbytes)
    return uuid.uuid5(CALLS, call.idempotency_key).hex[: 2 * nbytes]


class FutureNotFound(ApiError):
    status, type, code = 404, "invalid_request_error", "future_not_found"

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"future {request_id[:200]!r} does not exist, expired, or is not yours (futures "
            "live on the gateway instance that took the call, for an hour after their answer)",
            param="request_id",
        )

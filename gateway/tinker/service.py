"""The Tinker API's calls on one gateway instance: each training call becomes one
``train.step.requested`` (tenant: the API key's; policy: the model's) and a future; sampling runs
on the engines the OpenAI surface uses (gateway.service.Gateway.run) with token prompts.

Tenancy by construction: a ``model_id`` (``<session>:train:<n>``) names the policy
``<session>-<n>`` *of the caller's tenant*, and a sampler path or id names a policy the same way,
so another tenant's id can only point at a policy the caller does not have: the same 404 as a
missing one. Sessions and sampling sessions are stateless ids; models, futures, re-sent calls and
saved states are shared by every instance (gateway.tinker.shared and .answers), so any instance
answers any call, and what one remembers in memory is a cache of those rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import uuid
from typing import Any

import structlog

from catalog.refs import Ref
from gateway.errors import ApiError, ModelNotFound
from gateway.service import Gateway
from gateway.tinker import sampling, steps
from gateway.tinker.answers import Answers, lease_end
from gateway.tinker.bodies import (
    CreateModelRequest,
    LoadWeightsRequest,
    OptimStepRequest,
    SampleRequest,
    SaveWeightsForSamplerRequest,
    SaveWeightsRequest,
)
from gateway.tinker.calls import CallKey, Model, name_suffix, policy_of, remember
from gateway.tinker.futures import Done, Entry, Failed, FuturesTable, Outcome
from gateway.tinker.shared import FutureRecord, MemoryCalls, ModelRecord, SharedCalls
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
SAMPLER_ID = re.compile(r"^(?P<policy>[a-z0-9][a-z0-9._-]{0,126})@(?P<rev>\d{1,9})$")


class TinkerApi:
    def __init__(
        self,
        gw: Gateway,
        trainer: Trainer,
        base_models: list[str],
        *,
        futures: FuturesTable | None = None,
        max_context: int | None = None,
        shared: SharedCalls | None = None,
    ) -> None:
        self.gw, self.trainer = gw, trainer
        self.base_models = [b for b in base_models if b]
        self.max_context = max_context
        self.shared: SharedCalls = shared if shared is not None else MemoryCalls()
        self.futures = futures if futures is not None else FuturesTable()
        self.answers = Answers(self.futures, self.shared, self._finish, gw.config.retry_after_s)
        self._io = self.answers.io
        self._models: dict[tuple[str, str], Model] = {}
        self._states: dict[tuple[str, str], str] = {}  # (tenant, tinker path) → store uri
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
        # Created through another instance (or before a restart): the shared rows know it.
        row = await self._io(self.shared.model, tenant, policy)
        if row is None or row.model_id != model_id:
            raise ModelNotFound(str(model_id))
        model = Model(row.model_id, policy, row.base_model, row.rank, row.train_attn, row.train_mlp)
        return remember(self._models, (tenant, policy), model)

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
            first = await self.answers.first_of(tenant, event_id)
            if first is not None:
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
        entry = await self.answers.open(
            cmd.request_id, tenant, cmd.op, event_id, model_id=model.model_id, **context
        )
        try:
            await self.trainer.publish(env)
        except ApiError as e:  # a re-sent copy finds it failed so, and is sent again
            await self.answers.settle(entry, Failed(e.message, "server", queued=False))
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
        record = ModelRecord(
            model_id, policy, req.base_model, model.rank, model.train_attn, model.train_mlp
        )
        await self._io(self.shared.add_model, tenant, record)
        remember(self._models, (tenant, policy), model)
        return await self._submit(tenant, model, cmd, call)

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
        name = req.path or f"sampler-{req.sampling_session_seq_id or 0}-{name_suffix(call, 3)}"
        cmd = steps.step(self._request_id(), "save_for_sampler", model.base_model, name=name)
        return await self._submit(
            tenant, model, cmd, call, policy=model.policy, name=name, session_only=req.path is None
        )

    async def save_state(
        self, tenant: str, req: SaveWeightsRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        model = await self.model(tenant, req.model_id)
        name = req.path or f"state-{name_suffix(call, 4)}"
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
        source = self._states.get((tenant, req.path)) or await self._io(
            self.shared.state, tenant, req.path
        )
        if source is None:
            raise steps.bad(
                f"path {req.path!r} names no state saved by your tenant: pass the path that "
                "save_state returned",
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
            try:  # (the instance that took the call still has it: only others would miss it)
                self.shared.add_state(entry.tenant, outcome.json["path"], payload.state_uri)
            except Exception as e:
                log.warning("tinker state not shared", path=outcome.json["path"], error=str(e))
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
        if (tenant, policy) in self._models:
            return
        if await self._io(self.shared.model, tenant, policy) is None:
            await self.gw.target(Ref(tenant, policy, alias="prod"), shown)

    def sampler(self, sampler: str) -> dict[str, Any]:
        found = SAMPLER_ID.match(sampler)
        if found is None:
            raise ModelNotFound(sampler)
        base = self.base_models[0] if self.base_models else ""
        return {"sampler_id": sampler, "base_model": base, "model_path": None}

    async def sample(
        self, tenant: str, req: SampleRequest, call: CallKey | None = None
    ) -> dict[str, Any]:
        """Start a sample on the engines; a copy the SDK sends again answers the first one's
        future (sampling changes nothing, but it costs the engines the same work again)."""
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
        event_id = call.event_id(tenant, str(sid), "sample") if call else None
        first = await self.answers.first_of(tenant, event_id) if event_id else None
        request_id = first or self._request_id()
        ids = [f"{request_id}.{i}" for i in range(req.num_samples)]
        if first is not None:
            return {"request_id": first, "sample_sequence_ids": ids}
        payloads, sample = sampling.plan(req, policy, revision, request_id, self.gw.config)
        entry = await self.answers.open(
            request_id, tenant, "sample", event_id, leased=True, sample=sample
        )
        self._start_sample(entry, Ref(tenant, policy, revision=revision), payloads, sample)
        return {"request_id": request_id, "sample_sequence_ids": ids}

    def _start_sample(self, entry: Entry, ref: Ref, payloads: list[InferRequested], sample: dict):
        """Run ``payloads`` on the engines and answer as ``sample`` (its context) says."""
        answer = sampling.answer_from(sample)
        task = asyncio.create_task(self._run_sample(entry, ref, payloads, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _adopt_sample(self, tenant: str, row: FutureRecord) -> Entry | None:
        """Run here a sample whose instance is gone (its lease ran out), if no other instance
        took it first; the engines answer this instance under new request ids."""
        context = json.loads(row.context)
        sample = context.get("sample")
        if not sample or row.lease_until is None:
            return None
        if not await self._io(
            self.shared.claim, tenant, row.request_id, row.lease_until, lease_end()
        ):
            return None
        entry = self.futures.add(row.request_id, tenant, "sample", **context)
        entry.wall_created = row.created_at.timestamp()
        timeout_s = self.gw.config.answer_timeout_s
        payloads = sampling.payloads_from(sample, self._request_id(), timeout_s)
        ref = Ref(tenant, sample["policy"], revision=sample["revision"])
        log.info("tinker sample taken over", request_id=row.request_id, policy=ref.policy)
        self._start_sample(entry, ref, payloads, sample)
        return entry

    async def _run_sample(
        self, entry: Entry, ref: Ref, payloads: list[InferRequested], answer: sampling.Answer
    ) -> None:
        lease = asyncio.create_task(self.answers.renew_while_running(entry))
        try:
            shown = f"{ref.policy}@{payloads[0].revision}"
            done = await self.gw.run(ref, shown, payloads, uuid.uuid4())
            outcome: Outcome = Done(proto=sampling.sample_response(done, answer))
        except ApiError as e:
            outcome = Failed(e.message, "user" if e.status < 500 else "server")
        except Exception as e:  # a bug of ours: the caller still hears of it
            log.exception("sampling failed", request_id=entry.request_id)
            outcome = Failed(f"sampling failed: {type(e).__name__}", "server")
        finally:
            lease.cancel()
        await self.answers.settle(entry, outcome)

    # ------------------------------------------------------------------ futures

    async def retrieve(self, tenant: str, request_id: str) -> Outcome | None:
        return await self.answers.retrieve(tenant, request_id, adopt=self._adopt_sample)

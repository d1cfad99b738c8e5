"""Tinker calls ↔ MinT's step contract (schemas.events.steps): what each call asks the trainer
(a ``TrainStepRequested``'s fields) and what its answer becomes for the SDK. Pure functions: the
API (gateway.tinker.service) does the I/O."""

from __future__ import annotations

from typing import Any

import numpy as np
import structlog
from pydantic import BaseModel, ValidationError

from gateway.errors import BadRequest
from gateway.tinker.bodies import AdamParams, LoraConfig
from gateway.tinker.futures import Done, Entry, Failed, Outcome
from gateway.tinker.wire import FwdBwdRequest, encode_forward_backward_output
from schemas.events.steps import (
    LOSS_INPUTS,
    AdamSpec,
    StepDatum,
    TrainStepCompleted,
    TrainStepFailed,
    TrainStepRequested,
    loss_config,
)
from schemas.events.update import LoraSpec

ATTN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]
LOSSES = tuple(LOSS_INPUTS)
DATUM_INPUTS = ("target_tokens", "weights", "logprobs", "advantages", "sequence_ratio_mask")
# Tinker losses MinT cannot run, and why (a 400 naming the loss says it).
REFUSED_LOSSES = {
    "stable_reinforce": (
        "its objective is not published (Thinking Machines document only that it uses "
        "stability information their sampler records with record_stability_info=True, named "
        "by sequence_id provenance spans), and MinT's sampler records none"
    ),
    "custom": (
        "a loss uploaded with ServiceClient.create_custom_loss runs on Thinking Machines' "
        "servers only; pass the loss function itself to forward_backward_custom, which MinT runs"
    ),
}
# The SDK folds the metrics of a batch's calls by their ``name:reduction`` suffix (a name without
# one breaks it); the trainer's names (schemas.names.MetricName) have none: they are means.


log = structlog.get_logger()


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> BadRequest:
    return BadRequest(message, param=param, code=code)


def checked(model: type[BaseModel], **fields: Any) -> Any:
    """``model(**fields)``, a BadRequest naming the first wrong field otherwise."""
    try:
        return model(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        raise bad(f"{where}: {message}" if where else message, where or None) from e


def lora_spec(config: LoraConfig | None) -> LoraSpec:
    """A LoRA shape from Tinker's ``LoraConfig`` (rank, and which layers carry adapters)."""
    if config is None:
        raise bad(
            "create_model needs lora_config: MinT trains LoRA adapters only "
            "(use ServiceClient.create_lora_training_client)",
            "lora_config",
        )
    # Tinker's own default is train_unembed=True, so refusing it would break the SDK's default
    # call. The unembedding stays frozen: vLLM serves no LoRA on lm_head (and SmolLM2 ties it to
    # the embeddings). The README's compatibility table says so; the gateway logs it per model.
    if config.train_unembed:
        log.info("tinker_train_unembed_ignored", rank=config.rank)
    modules = (ATTN_MODULES if config.train_attn else []) + (
        MLP_MODULES if config.train_mlp else []
    )
    if not modules:
        raise bad(
            "lora_config: train_attn and train_mlp are both false: nothing to train",
            "lora_config",
        )
    return LoraSpec(rank=config.rank, alpha=float(2 * config.rank), target_modules=modules)


def datums(req: FwdBwdRequest) -> list[StepDatum]:
    """Tinker datums (token chunks + per-position tensors) as the contract's StepDatums."""
    if req.loss_fn in REFUSED_LOSSES:
        raise bad(
            f"loss_fn {req.loss_fn!r} is not supported by MinT: {REFUSED_LOSSES[req.loss_fn]}; "
            f"supported: {', '.join(LOSSES)}",
            "loss_fn",
            "unsupported_parameter",
        )
    if req.loss_fn not in LOSSES:
        raise bad(
            f"loss_fn {req.loss_fn!r} is not supported by MinT; supported: "
            f"{', '.join(LOSSES)} (and forward_backward_custom)",
            "loss_fn",
            "unsupported_parameter",
        )
    try:
        loss_config(req.loss_fn, req.loss_fn_config)
    except ValueError as e:
        raise bad(str(e), "loss_fn_config") from e
    if not req.data:
        raise bad("forward_backward needs at least one datum", "data")
    out = []
    for i, d in enumerate(req.data):
        unknown = sorted(set(d.inputs) - set(DATUM_INPUTS))
        if unknown:
            raise bad(
                f"data[{i}].loss_fn_inputs has {', '.join(unknown)}, which MinT's losses do "
                f"not take; expected some of {', '.join(DATUM_INPUTS)}",
                "loss_fn_inputs",
            )
        if "target_tokens" not in d.inputs:
            raise bad(f"data[{i}].loss_fn_inputs lacks target_tokens", "loss_fn_inputs")
        fields: dict[str, Any] = {"tokens": d.tokens}
        for name, values in d.inputs.items():
            if name == "target_tokens":
                fields[name] = [int(v) for v in values]
                continue
            _check_finite(values, f"data[{i}].loss_fn_inputs.{name}")
            fields[name] = values.tolist()
        try:
            out.append(StepDatum(**fields))
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            raise bad(f"data[{i}]{'.' + where if where else ''}: {message}", "data") from e
    return out


def _check_finite(values: np.ndarray, where: str) -> None:
    """A BadRequest naming the first NaN or infinity: the trainer cannot use one (a NaN
    weight or advantage makes every gradient NaN), and JSON cannot carry it."""
    bad_at = np.flatnonzero(~np.isfinite(np.asarray(values, dtype=np.float64)))
    if bad_at.size:
        at = int(bad_at[0])
        raise bad(
            f"{where}[{at}] is {float(values[at])}: loss inputs must be finite numbers "
            f"({bad_at.size} of {len(values)} are not)",
            "loss_fn_inputs",
        )


def adam_spec(params: AdamParams | None, other: dict[str, Any] | None) -> AdamSpec:
    if params is None:
        kind = (other or {}).get("type", "none")
        raise bad(
            f"optim_step: optimizer {kind!r} is not supported by MinT; send AdamParams",
            "adam_params",
            "unsupported_parameter",
        )
    return checked(AdamSpec, **params.model_dump())


def step(request_id: str, op: str, base_model: str, **fields: Any) -> TrainStepRequested:
    """The command, bounds checked (tokens per call, datums, losses' inputs) as a BadRequest."""
    return checked(
        TrainStepRequested, request_id=request_id, op=op, base_model=base_model, **fields
    )


# ---------------------------------------------------------------------------- answers


def sampler_path(policy: str, name: str, revision: int) -> str:
    """A sampler checkpoint's tinker path: the policy and the revision it pins."""
    return f"tinker://{policy}/sampler_weights/{name}@{revision}"


def state_path(policy: str, name: str) -> str:
    return f"tinker://{policy}/weights/{name}"


def sampler_id(policy: str, revision: int) -> str:
    """A sampling session's id: stateless, so any instance serves it (the tenant is the key's)."""
    return f"{policy}@{revision}"


def metrics_of(payload: TrainStepCompleted) -> dict[str, float]:
    """Tinker's metric names: the trainer's as ``name:mean``, the loss as ``loss:sum``."""
    out = {f"{k}:mean": v for k, v in payload.metrics.items()}
    if payload.loss is not None:
        out["loss:sum"] = payload.loss
    return out


def finish(entry: Entry, payload: Any) -> Outcome:
    """A training answer as the SDK's result for the call ``entry`` made."""
    if isinstance(payload, TrainStepFailed):
        user = payload.stage in ("validate", "policy")
        return Failed(f"{entry.kind}: {payload.reason}", "user" if user else "server")
    if not isinstance(payload, TrainStepCompleted):
        return Failed(f"unexpected answer {type(payload).__name__}", "server")
    ctx, op = entry.context, payload.op
    if op == "create":
        return Done({"model_id": ctx["model_id"], "type": "create_model"})
    if op in ("forward", "forward_backward"):
        return Done(proto=encode_forward_backward_output(payload.logprobs, metrics_of(payload)))
    if op == "optim_step":
        return Done({"metrics": metrics_of(payload)})
    if op == "save_for_sampler":
        if payload.revision is None:
            return Failed("save_for_sampler: the trainer's answer carries no revision", "server")
        if ctx.get("session_only"):
            return Done({"sampling_session_id": sampler_id(ctx["policy"], payload.revision)})
        path = sampler_path(ctx["policy"], ctx["name"], payload.revision)
        return Done({"path": path, "type": "save_weights_for_sampler"})
    if op == "save_state":
        return Done({"path": state_path(ctx["policy"], ctx["name"]), "type": "save_weights"})
    if op == "load_state":
        return Done({"path": ctx["path"], "model_id": ctx["model_id"], "type": "load_weights"})
    return Failed(f"unexpected answer to {op}", "server")

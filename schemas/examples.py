"""One valid example payload per event type (for docs, tests and benchmarks).

Store URIs point under ``s3://mint-store/<tenant>/<policy>/`` so they fit any envelope built with
the same tenant and policy: ``make_event(example_payload(t, "acme", "math-rl"), ...)``.
"""

from __future__ import annotations

from typing import Any

from schemas.envelope import Payload
from schemas.registry import EVENT_TYPES

DIGEST = "sha256:" + "ab" * 32
BASE_FINGERPRINT = "sha256:" + "cd" * 32


def example_fields(
    event_type: str, tenant: str = "acme", policy: str = "math-rl"
) -> dict[str, Any]:
    root = f"s3://mint-store/{tenant}/{policy}"
    return {
        "rollout.requested": {"base_model": "tiny-llama", "prompts": ["2+2="], "max_tokens": 8},
        "rollout.completed": {
            "revision": 1,
            "adapter_digest": DIGEST,
            "rollouts_uri": f"{root}/rollouts/r1.jsonl",
            "num_rollouts": 4,
            "mean_reward": 0.5,
            "duration_s": 1.5,
        },
        "update.requested": {"base_model": "tiny-llama", "data_uri": f"{root}/data/sft.jsonl"},
        "update.completed": {"steps": 1, "loss": 2.3, "duration_s": 0.8, "exported": True},
        "train.step.requested": {
            "request_id": "fwd-1",
            "op": "forward_backward",
            "base_model": "tiny-llama",
            "datums": [{"tokens": [1, 2, 3], "target_tokens": [2, 3, 4], "weights": [0, 1, 1]}],
        },
        "train.step.completed": {
            "request_id": "fwd-1",
            "op": "forward_backward",
            "loss": 2.3,
            "logprobs": [[-1.5, -0.8, -2.1]],
        },
        "train.step.failed": {
            "request_id": "fwd-1",
            "op": "optim_step",
            "stage": "policy",
            "reason": "acme/math-rl has no adapter: create it first",
        },
        "export.completed": {
            "revision": 1,
            "adapter_digest": DIGEST,
            "store_uri": f"{root}/revisions/1",
            "size_bytes": 65536,
            "rank": 8,
            "lora_alpha": 16.0,
            "target_modules": ["q_proj", "v_proj"],
            "base_model": "tiny-llama",
            "base_model_fingerprint": BASE_FINGERPRINT,
        },
        "eval.requested": {
            "revision": 1,
            "adapter_digest": DIGEST,
            "suite": "arith",
            "thresholds": {"accuracy": {"min": 0.5}},
        },
        "eval.completed": {
            "revision": 1,
            "adapter_digest": DIGEST,
            "suite": "arith",
            "metrics": {"accuracy": 0.75},
            "thresholds": {"accuracy": {"min": 0.5}},
            "passed": True,
        },
        "policy.configured": {
            "base_model": "tiny-llama",
            "suite": "arith",
            "thresholds": {"accuracy": {"min": 0.5}},
            "rollback_metric": "accuracy",
            "rollback_tolerance": 0.1,
        },
        "serving.promote": {"alias": "prod", "revision": 1, "reason": "eval passed"},
        "serving.rollback": {"alias": "prod", "reason": "regression"},
        "alias.moved": {
            "alias": "prod",
            "to_revision": 1,
            "adapter_digest": DIGEST,
            "store_uri": f"{root}/revisions/1",
            "cause": "promote",
        },
        "serving.refused": {
            "command_id": "6f1c2a4e-0b8d-4c3e-9a7f-1d2e3f405162",
            "command_type": "serving.promote",
            "alias": "prod",
            "reason": "alias acme/math-rl@prod is at revision 2, not the expected 1",
            "current_revision": 2,
        },
        "policy.retired": {"retired": True, "reason": "superseded by math-rl-v2"},
        "serving.canary": {"alias": "prod", "revision": 2, "share": 0.1, "expected_revision": 1},
        "canary.started": {
            "alias": "prod",
            "canary_id": "6f1c2a4e-0b8d-4c3e-9a7f-1d2e3f405163",
            "incumbent_revision": 1,
            "revision": 2,
            "adapter_digest": DIGEST,
            "store_uri": f"{root}/revisions/2",
            "share": 0.1,
        },
        "canary.ended": {
            "alias": "prod",
            "canary_id": "6f1c2a4e-0b8d-4c3e-9a7f-1d2e3f405163",
            "revision": 2,
            "incumbent_revision": 1,
            "outcome": "rolled_back",
            "reason": "mean feedback 0.61 < 0.80 - 0.02",
        },
        "feedback.submitted": {"request_id": "req-1", "score": 0.9},
        "policy.retire": {"retired": True, "reason": "superseded by math-rl-v2"},
        "revision.tag": {"revision": 2, "add": ["reviewed"], "remove": ["candidate"]},
        "revision.tagged": {"revision": 2, "tags": ["reviewed"]},
        "load.requested": {
            "revision": 1,
            "adapter_digest": DIGEST,
            "store_uri": f"{root}/revisions/1",
            "base_model": "tiny-llama",
        },
        "load.loaded": {
            "engine_id": "engine-0",
            "revision": 1,
            "adapter_digest": DIGEST,
            "load_ms": 12.5,
        },
        "load.evicted": {"engine_id": "engine-0", "revision": 1, "adapter_digest": DIGEST},
        "load.failed": {"revision": 1, "adapter_digest": DIGEST, "error": "digest mismatch"},
        "infer.requested": {"request_id": "req-1", "prompt": "2+2=", "max_tokens": 4},
        "infer.completed": {
            "request_id": "req-1",
            "revision": 1,
            "adapter_digest": DIGEST,
            "engine_id": "engine-0",
            "text": "4",
            "finish_reason": "stop",
            "prompt_tokens": 4,
            "completion_tokens": 1,
            "latency_ms": 20.0,
        },
        "infer.delta": {
            "request_id": "req-1",
            "engine_id": "engine-0",
            "seq": 0,
            "offset": 0,
            "text": "4",
            "tokens": 1,
            "revision": 1,
        },
        "infer.cancel": {
            "request_id": "req-1",
            "request_event_id": "5b8f0a52-1e8a-4f0e-9d0a-6f4d8f6c2a11",
        },
        "infer.failed": {
            "request_id": "req-2",
            "ref": f"{tenant}/{policy}@prod",
            "stage": "load",
            "error": "adapter digest mismatch",
            "revision": 1,
            "adapter_digest": DIGEST,
            "engine_id": "engine-0",
        },
    }[event_type]


def example_payload(event_type: str, tenant: str = "acme", policy: str = "math-rl") -> Payload:
    return EVENT_TYPES[event_type](**example_fields(event_type, tenant, policy))

"""A Kafka producer we did not write asks for a JSON-schema answer and gets one: kcat publishes
infer.requested bodies written by hand (JSON, checked against the published contract) on
infer.requests; the serving worker on the session's vLLM engine answers each on infer.results.
The JSON-schema answer (whitespace tokens biased away by logit_bias, see whitespace_bias) ends
by itself and parses as JSON valid against the schema, a choice answer is one of the choices,
a body without ``sampling`` (an old producer's) is answered as before, and a regex vLLM cannot
compile fails alone with vLLM's message (infer.failed, stage validate)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from datetime import UTC, datetime

import jsonschema
import pytest

from schemas import decode_event
from schemas.contracts import CONTRACTS_DIR
from schemas.events import InferCompleted, InferFailed
from streams import make_consumer

KCAT = shutil.which("kcat")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Small and closed (enums, a bounded integer, no extra keys): the session's model has random
# weights, so the grammar, not the model, has to make the answer short enough to finish.
SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["yes", "no"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
    },
    "required": ["verdict", "count", "ok"],
    "additionalProperties": False,
}


@pytest.fixture
def kcat() -> str:
    if KCAT is None:
        message = "kcat is not installed: `sudo apt-get install -y kcat` (Debian/Ubuntu)"
        if IN_CI:
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    return KCAT


def whitespace_bias(model_dir) -> dict[str, float]:
    """logit_bias (JSON keys are strings) pushing away every token that is only whitespace. JSON
    allows whitespace between any two tokens, and the random-weight model, greedy, picks it until
    the answer runs out of tokens (seen: '{ \\r"verdict" \\t \\r ...', length); vLLM's
    ``disable_any_whitespace`` is not in the contract, and logit_bias is."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [i for i in range(len(tok)) if tok.decode([i]) and not tok.decode([i]).strip()]
    assert 0 < len(ids) <= 1024, len(ids)
    return {str(i): -100.0 for i in ids}


def body(tenant: str, rid: str, revision: int, **payload) -> dict:
    """An infer.requested envelope as a foreign producer writes it: plain JSON, no MinT code."""
    return {
        "event_id": str(uuid.uuid4()),
        "type": "infer.requested",
        "schema_version": 1,
        "occurred_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "producer": "kcat/test",
        "tenant": tenant,
        "policy": "extract",
        "correlation_id": str(uuid.uuid4()),
        "causation_id": None,
        "payload": {
            "request_id": rid,
            "revision": revision,
            "prompt": "the cat sat",
            "max_tokens": 48,
            "temperature": 0.0,
            **payload,
        },
    }


def test_kcat_producer_asks_for_a_json_schema_answer_and_gets_one(
    stack, variant_factory, tiny_llama, kcat
) -> None:
    t = f"so{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "extract", variant_factory(701)).revision
    schema = {"structured": {"json_schema": SCHEMA}, "logit_bias": whitespace_bias(tiny_llama)}
    events = [
        body(t, "schema", rev, sampling=schema),
        body(t, "choice", rev, sampling={"structured": {"choice": ["yes", "no", "maybe"]}}),
        body(t, "plain", rev, max_tokens=4),  # an old producer's body: no sampling at all
        body(t, "bad-regex", rev, sampling={"structured": {"regex": "(unclosed"}}),
    ]
    contract = json.loads((CONTRACTS_DIR / "infer.requested.v1.json").read_text())
    validator = jsonschema.Draft202012Validator(
        contract, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for event in events:
        validator.validate(event)  # written from the published contract alone

    settings = stack.settings
    results = make_consumer(
        settings, settings.topic("infer.results"), group_id=f"kcat-{uuid.uuid4().hex[:8]}"
    )
    lines = "".join(f"{t}/extract\t{json.dumps(e)}\n" for e in events)
    subprocess.run(
        [kcat, "-P", "-b", settings.kafka_bootstrap, "-t", settings.topic("infer.requests")]
        + ["-K", "\t"],
        input=lines.encode(),
        check=True,
        timeout=30,
    )
    want = {e["payload"]["request_id"] for e in events}
    got: dict[str, object] = {}
    deadline = time.monotonic() + 240
    try:
        while want - set(got) and time.monotonic() < deadline:
            stack.worker.step(timeout_ms=50)
            for recs in results.poll(timeout_ms=10).values():
                for r in recs:
                    env = decode_event(r.value)
                    got[env.payload.request_id] = env.payload
    finally:
        results.close()
    assert not want - set(got), f"no result for {sorted(want - set(got))}"

    answer = got["schema"]
    assert isinstance(answer, InferCompleted), answer
    assert answer.finish_reason == "stop", (answer.finish_reason, answer.text)
    value = json.loads(answer.text)
    jsonschema.Draft202012Validator(SCHEMA).validate(value)

    choice = got["choice"]
    assert isinstance(choice, InferCompleted), choice
    assert choice.text in ("yes", "no", "maybe")

    plain = got["plain"]
    assert isinstance(plain, InferCompleted) and plain.completion_tokens >= 1, plain

    bad = got["bad-regex"]
    assert isinstance(bad, InferFailed), bad
    assert bad.stage == "validate" and "regex" in bad.error.lower(), bad

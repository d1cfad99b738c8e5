"""`mint timeline`: a policy's steps read back from real Kafka, in time order, with another
policy's events on the same partitions left out, as a table, JSON lines and a PNG."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from schemas.envelope import make_event
from schemas.events import (
    AliasMoved,
    EvalCompleted,
    ExportCompleted,
    InferCompleted,
    InferFailed,
    UpdateCompleted,
)
from schemas.settings import MintSettings, get_settings
from streams import EventProducer, ensure_topics
from streams.timeline import TOPICS

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32


def _at(env, minutes: float):
    return env.model_copy(update={"occurred_at": T0 + timedelta(minutes=minutes)})


def _events(policy: str):
    def ev(payload, minutes: float):
        return _at(make_event(payload, tenant="acme", policy=policy, producer="test"), minutes)

    uri = f"file:///store/acme/{policy}/{'ab' * 32}"
    export = {
        "adapter_digest": DIGEST,
        "store_uri": uri,
        "size_bytes": 10,
        "rank": 8,
        "base_model": "tiny",
        "base_model_fingerprint": DIGEST,
    }
    answered = {"engine_id": "e0", "text": "4", "prompt_tokens": 3, "completion_tokens": 1}
    answered |= {"adapter_digest": DIGEST, "finish_reason": "stop"}
    return [  # published out of time order on purpose: the timeline sorts
        ev(
            AliasMoved(
                alias="prod",
                to_revision=1,
                adapter_digest=DIGEST,
                store_uri=uri,
                cause="promote",
                reason="gate passed",
            ),
            3,
        ),
        ev(UpdateCompleted(steps=4, loss=0.5, duration_s=2.0, exported=True), 0),
        ev(ExportCompleted(revision=1, **export), 1),
        ev(
            EvalCompleted(
                revision=1,
                adapter_digest=DIGEST,
                suite="arith",
                metrics={"accuracy": 0.9},
                passed=True,
            ),
            2,
        ),
        ev(InferCompleted(request_id="r1", revision=1, latency_ms=40.0, **answered), 4),
        ev(InferCompleted(request_id="r2", revision=1, latency_ms=60.0, **answered), 4.2),
        ev(
            InferFailed(
                request_id="r3",
                ref=f"acme/{policy}@prod",
                stage="generate",
                error="x",
                engine_id="e0",
                revision=1,
            ),
            4.4,
        ),
    ]


def test_a_policys_steps_in_order_as_table_json_and_png(
    settings: MintSettings, monkeypatch, tmp_path
) -> None:
    ensure_topics(settings, list(TOPICS))
    with EventProducer(settings) as producer:
        producer.publish_many(_events("chat") + _events("other"))
    monkeypatch.setenv("MINT_TOPIC_PREFIX", settings.topic_prefix)
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        got = runner.invoke(_cli(), ["timeline", "acme/chat", "-o", "json"])
        assert got.exit_code == 0, got.output
        rows = [json.loads(line) for line in got.stdout.splitlines()]
        assert [(r["kind"], r["revision"]) for r in rows] == [
            ("trained", None),
            ("exported", 1),
            ("evaluated", 1),
            ("promoted", 1),
            ("served", 1),
        ], "one policy's steps, in time order, answers counted once per bucket"
        assert rows[-1]["count"] == 3 and rows[-1]["detail"].startswith("2 answered, 1 failed")
        assert "suite arith passed" in rows[2]["detail"]

        png = tmp_path / "chat.png"
        table = runner.invoke(_cli(), ["timeline", "acme/chat", "--png", str(png)])
        assert table.exit_code == 0, table.output
        assert "promoted" in table.stdout and "@prod new -> r1 gate passed" in table.stdout
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        none = runner.invoke(_cli(), ["timeline", "acme/nobody"])
        assert none.exit_code == 0 and "no events of acme/nobody" in none.stderr
        bad = runner.invoke(_cli(), ["timeline", "not a policy"])
        assert bad.exit_code == 2
    finally:
        get_settings.cache_clear()


def _cli():
    from mint.cli import main

    return main

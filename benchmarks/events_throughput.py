"""Validated events per second, producer → Kafka → consumer loop, on this machine.

Prints ONE JSON line, measured side by side in one run (``export.completed`` events, ~700 B):
- ``validate_eps``: encode + decode + pydantic validation alone (no broker): the CPU ceiling;
- ``produce_eps``: ``EventProducer.publish_many`` (acks=all, idempotent, every send confirmed)
  with the default settings, and ``produce_batched_eps`` with bigger batches (``BATCHED``);
- ``consume_eps``: ``run_consumer`` draining a backlog (decode, validate, handler, commit);
- ``pipeline_eps``: a producer process and the consumer loop running together, from the first
  send until the handler has seen every event;
- ratios of these to each other;
- ``targets`` / ``met``: ``pipeline_eps`` >= 15,000 (the issue's "Performance" target).

    python -m benchmarks.events_throughput            # 20,000 events per phase
    python -m benchmarks.events_throughput --smoke    # 300 events (the test)

Topics live under a fresh prefix (bench<random>) and are deleted at the end.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time
import uuid

from benchmarks._harness import emit, parser, targets_and_met
from schemas import decode_event, encode_event, make_event
from schemas.examples import example_payload
from schemas.logs import configure_logging
from schemas.settings import MintSettings
from streams import EventProducer, ensure_topics, make_admin, run_consumer

# Bigger batches for bulk producers (replays, backfills); the default keeps linger at 5 ms.
BATCHED = {"linger_ms": 20, "batch_size": 256 * 1024}
POLICIES = 64
TARGET_PIPELINE_EPS = 15_000  # validated events/s end to end (issue "Performance")


def _events(n: int) -> list:
    return [
        make_event(
            example_payload("export.completed", "bench", f"p{i % POLICIES}"),
            tenant="bench",
            policy=f"p{i % POLICIES}",
            producer="bench",
        )
        for i in range(n)
    ]


def _publish(producer: EventProducer, events: list, chunk: int = 2000) -> None:
    for i in range(0, len(events), chunk):
        producer.publish_many(events[i : i + chunk])


def _timed_publish(settings: MintSettings, n: int, **options) -> float:
    events, warm = _events(n), _events(min(n, 500))
    with EventProducer(settings, **options) as producer:
        _publish(producer, warm)  # connections and metadata before timing
        t = time.perf_counter()
        _publish(producer, events)
        return time.perf_counter() - t


def _producer_process(settings_json: str, n: int, go, done_at) -> None:
    settings = MintSettings.model_validate_json(settings_json)
    events = _events(n)
    with EventProducer(settings) as producer:
        producer.publish_many(events[:1])  # connect before the clock starts
        go.wait()
        _publish(producer, events[1:])
    done_at.value = time.perf_counter()


def run(n: int) -> dict[str, object]:
    settings = MintSettings(topic_prefix=f"bench{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, ["export.events", "dlq"])
    try:
        events = _events(n)
        wire = [encode_event(e) for e in events]
        for e in events[:200]:  # warm pydantic's validators before timing
            decode_event(encode_event(e))
        t = time.perf_counter()
        for e in events:
            decode_event(encode_event(e))
        validate_s = time.perf_counter() - t

        produce_s = _timed_publish(settings, n)
        batched_s = _timed_publish(settings, n, **BATCHED)
        backlog = 2 * (n + min(n, 500))

        seen, first = 0, [0.0]
        done = threading.Event()

        def handle(env, record) -> None:
            nonlocal seen
            if seen == 0:
                first[0] = time.perf_counter()
            seen += 1

        consumer = threading.Thread(
            target=run_consumer,
            daemon=True,
            args=(settings, ["export.events"], "bench", handle),
            kwargs={"max_records": backlog + n, "stop": done},
        )
        consumer.start()
        _wait(lambda: seen >= backlog, consumer, "the backlog")
        consume_s = time.perf_counter() - first[0]

        ctx = mp.get_context("spawn")
        go, done_at = ctx.Event(), ctx.Value("d", 0.0)
        producer = ctx.Process(
            target=_producer_process, args=(settings.model_dump_json(), n, go, done_at)
        )
        producer.start()
        _wait(lambda: seen >= backlog + 1, consumer, "the producer process to connect")
        t = time.perf_counter()
        go.set()
        _wait(lambda: seen >= backlog + n, consumer, "the pipeline")
        pipeline_s = time.perf_counter() - t
        producer.join(30)
        done.set()
        consumer.join(30)
    finally:
        admin = make_admin(settings)
        admin.delete_topics([settings.topic("export.events"), settings.topic("dlq")])
        admin.close()
    validate_eps, produce_eps, batched_eps = n / validate_s, n / produce_s, n / batched_s
    consume_eps, pipeline_eps = backlog / consume_s, (n - 1) / pipeline_s
    return {
        "benchmark": "events_throughput",
        "events": n,
        "event_type": "export.completed",
        "event_bytes": round(sum(map(len, wire)) / n),
        "policies": POLICIES,
        "partitions": settings.topic_partitions,
        "validate_eps": round(validate_eps),
        "produce_eps": round(produce_eps),
        "produce_batched_eps": round(batched_eps),
        "consume_eps": round(consume_eps),
        "pipeline_eps": round(pipeline_eps),
        "batched_vs_default_produce": round(batched_eps / produce_eps, 3),
        "consume_vs_validate": round(consume_eps / validate_eps, 3),
        "pipeline_vs_produce": round(pipeline_eps / produce_eps, 3),
        "pipeline_vs_validate": round(pipeline_eps / validate_eps, 3),
        **targets_and_met(pipeline_eps=(pipeline_eps, ">=", TARGET_PIPELINE_EPS)),
    }


def _wait(predicate, consumer: threading.Thread, what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline or not consumer.is_alive():
            raise RuntimeError(f"gave up waiting for {what} after {timeout_s} s")
        time.sleep(0.001)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "300 events, for the test suite")
    ap.add_argument("--events", type=int, default=20_000)
    args = ap.parse_args(argv)
    configure_logging("WARNING", "json")  # logs to stderr; stdout carries the one JSON line
    figures = {"benchmark": "events_throughput", "smoke": args.smoke}
    figures.update(run(300 if args.smoke else args.events))
    emit(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())

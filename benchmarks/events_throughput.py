"""Validated events per second, producer → Kafka → consumer loop, on this machine.

Prints ONE JSON line, measured side by side in one run:
- ``validate_eps``: encode + decode + pydantic validation alone (no broker): the CPU ceiling;
- ``produce_eps``: ``EventProducer.publish_many`` (acks=all, idempotent, confirmed) alone;
- ``pipeline_eps``: producer and ``run_consumer`` running together, from the first send until
  the consumer's handler has seen every event (each decoded, validated, offset committed);
- ratios of the pipeline to each.

    python -m benchmarks.events_throughput            # 20,000 export.completed events
    python -m benchmarks.events_throughput --smoke    # 300 events (the test)

Topics live under a fresh prefix (bench<random>) and are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid

from schemas import decode_event, encode_event, make_event
from schemas.examples import example_payload
from schemas.logs import configure_logging
from schemas.settings import MintSettings
from streams import EventProducer, ensure_topics, make_admin, run_consumer


def _events(n: int, policies: int) -> list:
    return [
        make_event(
            example_payload("export.completed", "bench", f"p{i % policies}"),
            tenant="bench",
            policy=f"p{i % policies}",
            producer="bench",
        )  # fmt: skip
        for i in range(n)
    ]


def _publish(producer: EventProducer, events: list, chunk: int = 2000) -> None:
    for i in range(0, len(events), chunk):
        producer.publish_many(events[i : i + chunk])


def run(n: int, policies: int = 64) -> dict[str, object]:
    settings = MintSettings(topic_prefix=f"bench{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, ["export.events", "dlq"])
    try:
        events = _events(n, policies)
        wire = [encode_event(e) for e in events]

        t = time.perf_counter()
        for e in events:
            decode_event(encode_event(e))
        validate_s = time.perf_counter() - t

        with EventProducer(settings) as producer:
            t = time.perf_counter()
            _publish(producer, events)
            produce_s = time.perf_counter() - t

            # Pipeline: a consumer group reads a second copy while it is being produced.
            second = _events(n, policies)
            seen = 0
            done = threading.Event()

            def handle(env, record) -> None:
                nonlocal seen
                seen += 1

            consumer = threading.Thread(
                target=run_consumer,
                args=(settings, ["export.events"], "bench", handle),
                kwargs={"max_records": 2 * n, "stop": done},
            )
            consumer.start()
            deadline = time.monotonic() + 120
            while seen < n:  # the first copy: wait until the group is up and caught up
                if time.monotonic() > deadline or not consumer.is_alive():
                    raise RuntimeError(f"consumer saw {seen} of {n} events in 120 s")
                time.sleep(0.01)
            t = time.perf_counter()
            _publish(producer, second)
            while seen < 2 * n:
                if time.monotonic() > deadline + 120 or not consumer.is_alive():
                    raise RuntimeError(f"consumer saw {seen} of {2 * n} events")
                time.sleep(0.001)
            pipeline_s = time.perf_counter() - t
            done.set()
            consumer.join(30)
    finally:
        admin = make_admin(settings)
        admin.delete_topics([settings.topic("export.events"), settings.topic("dlq")])
        admin.close()
    validate_eps, produce_eps, pipeline_eps = n / validate_s, n / produce_s, n / pipeline_s
    return {
        "benchmark": "events_throughput",
        "events": n,
        "event_type": "export.completed",
        "event_bytes": round(sum(map(len, wire)) / n),
        "policies": policies,
        "partitions": settings.topic_partitions,
        "validate_eps": round(validate_eps),
        "produce_eps": round(produce_eps),
        "pipeline_eps": round(pipeline_eps),
        "pipeline_vs_validate": round(pipeline_eps / validate_eps, 3),
        "pipeline_vs_produce": round(pipeline_eps / produce_eps, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--smoke", action="store_true", help="300 events, for the test suite")
    args = parser.parse_args(argv)
    configure_logging("WARNING", "json")  # logs to stderr; stdout carries the one JSON line
    print(json.dumps(run(300 if args.smoke else args.events)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Each tenant's answers on a topic of its own: the router's consumer wiring.

Kafka's ACLs name topics, not record keys, so "a tenant reads only its own answers" needs a topic
per tenant. Engines and the gateway keep to the one internal ``infer.results`` (the engine's
redelivery check and every gateway instance read it); this worker, a consumer group of its own,
copies each record unchanged (key, value, headers: the same event id) to
``<prefix>.tenant.<tenant>.infer.results``, the tenant taken from the envelope. The copy keeps
the policy key and the partition count, so one policy's answers stay in order.

At least once, like every MinT consumer: the offset is committed after the broker confirmed the
copy, and a record seen again by this process (a rebalance handed it back) is not copied twice;
after a crash between the copy and the commit the copy is repeated with the same event id, which
readers dedupe on. A tenant's topic is created the first time one of its answers passes
(``mint security tenant`` creates it ahead, so a reader can subscribe before the first answer).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import structlog
from kafka.consumer.fetcher import ConsumerRecord

from schemas.envelope import Envelope
from schemas.logs import configure_logging
from schemas.settings import MintSettings, get_settings
from streams import health
from streams.group import run_consumer
from streams.producer import EventProducer
from streams.records import ConsumerStats, RetryPolicy, stop_on_signals
from streams.topics import ensure_tenant_topics, tenant_topic

log = structlog.get_logger()

ROUTER_GROUP = "tenant-router"
ROUTER_TOPICS = ("infer.results",)
REMEMBERED = 100_000  # event ids of copies made, for redeliveries within this process


class TenantCopier:
    """The handler: one record of ``infer.results`` → the same bytes on its tenant's topic."""

    def __init__(self, settings: MintSettings, producer: EventProducer) -> None:
        self.settings, self.producer = settings, producer
        self._ready: set[str] = set()  # tenants whose topic is known to exist
        self._copied: OrderedDict[Any, None] = OrderedDict()
        self._lock = threading.Lock()  # records of different policies run on threads
        self.copies = self.repeats = 0

    def __call__(self, env: Envelope[Any], record: ConsumerRecord) -> None:
        with self._lock:
            if env.event_id in self._copied:
                self.repeats += 1
                return
        if env.tenant not in self._ready:
            ensure_tenant_topics(self.settings, env.tenant)
            self._ready.add(env.tenant)
        self.producer.send_raw(
            tenant_topic(self.settings, env.tenant),
            record.value,
            record.key,
            list(record.headers or []),
        )
        with self._lock:
            self.copies += 1
            self._copied[env.event_id] = None
            while len(self._copied) > REMEMBERED:
                self._copied.popitem(last=False)


def run_router(
    settings: MintSettings,
    *,
    stop: threading.Event | None = None,
    group_id: str = ROUTER_GROUP,
    idle_timeout_s: float | None = None,
    max_records: int | None = None,
    retry: RetryPolicy | None = None,
    **consumer_options: Any,
) -> ConsumerStats:
    """Copy answers to their tenants' topics until ``stop`` is set (or idle / ``max_records``)."""
    producer = EventProducer(settings, client_id=f"{group_id}-copies")
    try:
        copier = TenantCopier(settings, producer)
        # A new group starts at the beginning of the retained answers: none is left uncopied.
        consumer_options.setdefault("auto_offset_reset", "earliest")
        stats = run_consumer(
            settings,
            ROUTER_TOPICS,
            group_id,
            copier,
            stop=stop,
            retry=retry,
            idle_timeout_s=idle_timeout_s,
            max_records=max_records,
            **consumer_options,
        )
        log.info("router stopped", copies=copier.copies, repeats=copier.repeats)
        return stats
    finally:
        producer.close()


def main(parallel: int = 8) -> None:
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    health.serve(settings.metrics_port)  # MINT_METRICS_PORT: /metrics, /healthz, /readyz
    # Each copy waits for the broker's acknowledgement: different policies overlap theirs.
    run_router(
        settings,
        stop=stop_on_signals(),
        parallel_keys=parallel,
        group_id=f"{settings.topic_prefix}-{ROUTER_GROUP}",
    )


if __name__ == "__main__":
    main()

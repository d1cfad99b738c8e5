"""fault_injection.py's steady traffic and what it reads back: answers, dead letters, and
waits that notice a crashed worker at once."""

from __future__ import annotations

import sys
import threading
import time

POLICY = "chaos"


class Traffic(threading.Thread):
    """Steady inference requests, every ``every_s`` whether or not the broker is up (as an
    upstream system keeps producing); a send the producer gave up on is sent again, the same
    event, so its answer dedupes. A request counts as sent once the broker confirmed it."""

    def __init__(self, client, every_s: float = 0.25) -> None:
        super().__init__(name="traffic", daemon=True)
        self.client, self.every_s = client, every_s
        self.sent: dict[str, float] = {}  # request_id -> when the broker confirmed it
        self.send_retries = 0
        self.halt = threading.Event()
        self._lock = threading.Lock()
        self._inflight: list[tuple[str, object, object]] = []  # (request_id, env, future)
        self.n = 0

    def send(self, request_id: str, prompt: str) -> None:
        from schemas import make_event
        from schemas.events import InferRequested

        env = make_event(
            InferRequested(request_id=request_id, prompt=prompt, max_tokens=4),
            tenant=self.client.tenant,
            policy=POLICY,
            producer=self.client.name,
        )
        self._send(request_id, env)

    def _send(self, request_id: str, env) -> None:
        from schemas.registry import encode_event
        from streams.topics import topic_for_type

        topic = topic_for_type(self.client.settings, env.type)
        future = self.client.producer.send_async(topic, encode_event(env), env.key)
        with self._lock:
            self._inflight.append((request_id, env, future))

    def settle(self) -> None:
        """Note what the broker confirmed; send again what the producer gave up on."""
        with self._lock:
            inflight, self._inflight = self._inflight, []
        for request_id, env, future in inflight:
            if not future.is_done:
                with self._lock:
                    self._inflight.append((request_id, env, future))
            elif future.succeeded():
                self.sent.setdefault(request_id, time.monotonic())
            else:
                self.send_retries += 1
                self._send(request_id, env)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._inflight)

    def run(self) -> None:
        from mint.demo import PROMPTS

        while not self.halt.wait(self.every_s):
            self.send(f"steady-{self.n}", PROMPTS[self.n % len(PROMPTS)])
            self.n += 1
            self.settle()

    def finish(self, timeout_s: float = 180.0) -> None:
        """Stop producing; wait until every request was confirmed."""
        self.halt.set()
        self.join(timeout=30)
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            self.settle()
            time.sleep(0.2)


def answered(client) -> dict[str, float]:
    """request_id -> now, for each request whose answer (completed or failed) the SDK has seen;
    when each was first seen is AnswerClock's (benchmarks/_fault_cluster.py)."""
    out: dict[str, float] = {}
    for env in client.events(POLICY, ["infer.completed", "infer.failed"]):
        out.setdefault(env.payload.request_id, time.monotonic())
    return out


def dead_letters(settings) -> int:
    from kafka import TopicPartition

    from streams.clients import make_consumer
    from streams.topics import DLQ, topic_for

    topic = topic_for(settings, DLQ)
    consumer = make_consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(tps).values()) if tps else 0
    finally:
        consumer.close()


def watched(workers, wait, timeout_s: float = 600.0):
    """``wait(timeout_s=…)`` in short slices, checking between them that every worker is alive:
    a worker that crashed fails the run at once, with its log's end, instead of after the whole
    timeout with only "no answer"."""
    from mint.sdk import WaitTimeout

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return wait(timeout_s=min(10.0, max(0.1, deadline - time.monotonic())))
        except WaitTimeout:
            workers.check()
            if time.monotonic() >= deadline:
                # where each worker stands (stacks and log ends) on the way out
                print(workers.report(tail_chars=1500), file=sys.stderr, flush=True)
                raise

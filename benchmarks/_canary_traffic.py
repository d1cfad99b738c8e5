"""The client side of benchmarks/canary.py: steady chat traffic through the gateway with the real
``openai`` client (each request from one of many callers, the revision that answered read from
``x-mint-revision``), a feedback score for every answer (``POST /v1/feedback``), and a follower
of ``serving.events`` that notes when this client saw each event."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks._canary_figures import Answer, draw_score
from benchmarks._openai_load import chat_prompts
from schemas.settings import MintSettings

Predicate = Callable[[Any], bool]
SCORE_SD = 0.1  # spread of the drawn scores around each revision's mean


class EventLog:
    """Follows ``serving.events`` from its end (positioned before anything is published) and
    keeps every event with the monotonic time this process got it."""

    def __init__(self, settings: MintSettings) -> None:
        from streams.follower import Follower
        from streams.topics import topic_for

        self._follower = Follower(settings, client_id="bench-canary")
        self._follower.assign(self._follower.partitions(topic_for(settings, "serving.events")))
        self._seen: list[tuple[Any, float]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="canary-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from schemas import decode_event
        from schemas.exceptions import SchemaError

        for records in self._follower.follow(self._stop, timeout_ms=50):
            now = time.monotonic()
            got = []
            for r in records:
                try:
                    got.append((decode_event(r.value), now))
                except SchemaError:
                    continue  # not ours to judge
            if got:
                with self._cond:
                    self._seen.extend(got)
                    self._cond.notify_all()

    def find(self, predicate: Predicate) -> tuple[Any, float] | None:
        """The first event so far matching ``predicate``, with when it was seen."""
        with self._cond:
            return next(((e, t) for e, t in self._seen if predicate(e)), None)

    def wait(
        self, predicate: Predicate, timeout_s: float, check: Callable[[], None] | None = None
    ) -> tuple[Any, float] | None:
        """``find`` until it finds or ``timeout_s`` passed (None); ``check`` runs every half
        second (it raises when a worker died)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.find(predicate)
            if found is not None or time.monotonic() >= deadline:
                return found
            if check is not None:
                check()
            with self._cond:
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._follower.close()


class Traffic:
    """``concurrency`` threads sending chat completions to ``model`` one after another until
    stopped; after each answer, a feedback score drawn for the revision that answered
    (``means[revision]``), so the controller sees the canary better or worse than prod."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        label: str,
        means: dict[int, float],
        callers: int,
        max_tokens: int,
        seed: int = 0,
        timeout_s: float = 120.0,
        transport: Any = None,  # an httpx transport in place of the network (unit tests)
    ) -> None:
        import httpx
        from openai import OpenAI

        self.model, self.label, self.means = model, label, means
        self.callers, self.max_tokens, self.seed = callers, max_tokens, seed
        self.client = OpenAI(
            base_url=f"{base_url}/v1",
            api_key=api_key,
            timeout=timeout_s,
            max_retries=0,
            http_client=httpx.Client(transport=transport) if transport is not None else None,
        )
        self.http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
            transport=transport,
        )
        self.prompts = chat_prompts(64)
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []

    def caller(self, index: int) -> str:
        """Request ``index``'s caller: one of ``callers`` ids, the same for every run of a seed."""
        return f"caller-{random.Random(f'{self.seed}:caller:{index}').randrange(self.callers)}"

    def ask(self, index: int, *, feedback: bool = True) -> Answer:
        """One request (and its feedback score): never raises, an error is part of the answer."""
        a = Answer(index=index, caller=self.caller(index), sent=time.monotonic())
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=self.model,
                messages=self.prompts[index % len(self.prompts)],  # type: ignore[arg-type]
                max_tokens=self.max_tokens,
                temperature=0,
                user=a.caller,
            )
            a.answered = time.monotonic()
            a.response_id = raw.parse().id
            header = raw.headers.get("x-mint-revision", "")
            if not header.isdigit():
                raise ValueError(f"x-mint-revision is {header!r}, not one revision number")
            a.revision = int(header)
        except Exception as e:  # a failed request is a counted figure, not the end of the run
            a.answered = a.answered or time.monotonic()
            a.error = f"{type(e).__name__}: {str(e)[:200]}"
            return a
        if feedback:
            self.feedback(a)
        return a

    def feedback(self, a: Answer) -> None:
        mean = self.means.get(a.revision or 0, min(self.means.values()))
        a.score = draw_score(self.seed, self.label, a.index, mean, SCORE_SD)
        try:
            r = self.http.post(
                "/v1/feedback", json={"model": self.model, "id": a.response_id, "score": a.score}
            )
            a.feedback_status = r.status_code
            if r.status_code >= 300:
                a.feedback_error = f"{r.status_code}: {r.text[:200]}"
        except Exception as e:  # counted: feedback_failed
            a.feedback_error = f"{type(e).__name__}: {str(e)[:200]}"

    def _loop(self) -> None:
        while not self._halt.is_set():
            a = self.ask(next(self._counter))
            with self._lock:
                self.answers.append(a)

    def start(self, concurrency: int) -> None:
        for k in range(concurrency):
            t = threading.Thread(target=self._loop, name=f"canary-client-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 150.0) -> None:
        """Stop sending; the requests in flight finish (their answers count)."""
        self._halt.set()
        for t in self._threads:
            t.join(timeout=timeout_s)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

    def sent_since(self, since: float) -> int:
        with self._lock:
            return sum(a.sent > since for a in self.answers)

    def close(self) -> None:
        self.client.close()
        self.http.close()

"""The processes and the producer of benchmarks/poison_traffic.py: the engine group (``e1``
hosting the evaluator), a supervisor that restarts what exits or silently fell out of its group,
and the upstream producer of ``infer.requested`` bytes."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from benchmarks import _engine_group as eg
from benchmarks._engine_group import say
from benchmarks._traffic import PROMPTS


@dataclass(frozen=True)
class Sent:
    event_id: uuid.UUID
    request_id: str
    tenant: str
    policy: str
    kind: str  # ordinary, warmup, probe or a bad kind
    phase: str
    created: datetime
    value: bytes
    key: bytes


class Engines(eg.EngineGroup):
    """The serving group; ``e1`` hosts the evaluator too. ``revive`` restarts an engine that
    exited (up to ``max_restarts`` in all) and keeps what its log said last."""

    HOST = "e1"

    def __init__(self, *args: Any, max_restarts: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_restarts = max_restarts
        self.exits: list[dict[str, Any]] = []

    def start(self, *engine_ids: str) -> None:
        for eid in engine_ids:
            if eid in self.started:
                self.started.remove(eid)
            kind = ("evaluator", "--with-serving") if eid == self.HOST else ("serving",)
            self.workers.start(eid, *kind, *self.args, "--engine-id", eid, **self.env)
            self.started.append(eid)

    def revive(self) -> None:
        for eid, p in list(self.workers.procs.items()):
            if p.poll() is None:
                continue
            del self.workers.procs[eid]
            lines = (self.log_dir / f"{eid}.log").read_text(errors="replace").splitlines()
            tail = [ln[:400] for ln in lines if ln.strip()][-3:]
            errors = [ln[:600] for ln in lines if "Error" in ln or "error" in ln][-3:]
            self.exits.append(
                {"engine": eid, "returncode": p.returncode, "errors": errors, "log_tail": tail}
            )
            say(f"[red]{eid} exited with {p.returncode}: {tail[-1] if tail else ''}")
            if len(self.exits) <= self.max_restarts:
                self.start(eid)


class Supervisor(threading.Thread):
    """Restarts what exits, every half second: the engines (counted) and the side workers. A
    worker that joined a group and then is missing from it for ``DROPPED_S`` while its process
    runs fell out without noticing (seen here under heavy CPU load: the controller's and e1's
    evaluator lane then handled nothing, and their LeaveGroup at stop met UnknownMemberId); it
    is restarted too and named in ``rejoined`` (as multi_engine does for engines at start)."""

    GROUPS = {"controller": "controller", "projector": "catalog-projector", "e1": "evaluator"}

    def __init__(self, engines: Engines, side: Any, settings: Any) -> None:
        super().__init__(name="supervisor", daemon=True)
        self.engines, self.side, self.settings = engines, side, settings
        self.side_exits: list[str] = []
        self.rejoined: list[str] = []
        self.halt = threading.Event()
        self._out_since: dict[str, float] = {}
        self._pid: dict[str, int] = {}  # the process last seen, and its log's assignments then
        self._assigned: dict[str, int] = {}

    def run(self) -> None:
        n = 0
        while not self.halt.wait(0.5):
            self.engines.revive()
            for name, p in list(self.side.procs.items()):
                if p.poll() is None:
                    continue
                self.side_exits.append(f"{name} exited with {p.returncode}")
                say(f"[red]{name} exited with {p.returncode}; restarting it")
                del self.side.procs[name]
                self.side.start_worker(name)
            n += 1
            if n % 10 == 0:
                with contextlib.suppress(Exception):  # a slow broker: look again next time
                    self.rejoin_dropped()

    def rejoin_dropped(self) -> None:
        from streams.clients import make_admin

        groups = {f"{self.settings.topic_prefix}-{g}": name for name, g in self.GROUPS.items()}
        admin = make_admin(self.settings)
        try:
            found = admin.describe_groups(list(groups))
        finally:
            admin.close()
        now = time.monotonic()
        for group, name in groups.items():
            proc = self.side.procs.get(name) or self.engines.workers.procs.get(name)
            log = (self.side.log_dir / f"{name}.log").read_text(errors="replace")
            assigned = sum(f'"{group}"' in ln and eg.ASSIGNED in ln for ln in log.splitlines())
            if proc is not None and self._pid.setdefault(name, proc.pid) != proc.pid:
                # Restarted (the log is appended to): only its own assignments count.
                self._pid[name], self._assigned[name] = proc.pid, assigned
            joined = assigned > self._assigned.get(name, 0)
            if (found.get(group) or {}).get("members") or not joined or proc is None:
                self._out_since.pop(name, None)
            elif now - self._out_since.setdefault(name, now) > eg.DROPPED_S:
                say(f"[yellow]{name} runs but fell out of group {group}; restarting it")
                self.rejoined.append(f"{name} fell out of {group}")
                self._out_since.pop(name, None)
                if name in self.side.procs:
                    self.side.stop(name, sig=signal.SIGKILL)
                    self.side.start_worker(name)
                else:
                    self.engines.kill(name)
                    self.engines.start(name)


class Upstream:
    """The upstream producer: ``infer.requested`` as raw bytes (so out-of-schema values go out
    as a non-Python producer would send them), each confirmed by the broker; remembers what it
    sent."""

    def __init__(self, settings: Any) -> None:
        from streams.producer import EventProducer

        self.settings = settings
        self.producer = EventProducer(settings, client_id="upstream")
        self.sent: list[Sent] = []
        self.rng = random.Random(0)
        self._lock = threading.Lock()

    def envelope(self, tenant: str, policy: str, **payload: Any):
        from schemas import make_event
        from schemas.events import InferRequested

        fields = {
            "request_id": uuid.uuid4().hex,
            "prompt": self.rng.choice(PROMPTS),
            "alias": "prod",
            "max_tokens": 8,
            **payload,
        }
        return make_event(
            InferRequested(**fields), tenant=tenant, policy=policy, producer="bench/upstream"
        )

    def send(
        self,
        tenant: str,
        policy: str,
        kind: str,
        phase: str,
        *,
        raw: dict | None = None,
        times: int = 1,
        **payload: Any,
    ) -> Sent:
        """One request (``raw`` overrides payload fields in the JSON, unchecked), sent
        ``times`` times as the same bytes."""
        from schemas.registry import encode_event

        env = self.envelope(tenant, policy, **payload)
        value = encode_event(env)
        if raw:
            obj = json.loads(value)
            obj["payload"].update(raw)
            value = json.dumps(obj).encode()
        s = Sent(
            env.event_id,
            env.payload.request_id,
            tenant,
            policy,
            kind,
            phase,
            env.occurred_at,
            value,
            env.key,
        )
        for _ in range(times):
            self.resend(s)
        with self._lock:
            self.sent.append(s)
        return s

    def resend(self, s: Sent) -> None:
        self.producer.send_raw(self.settings.topic("infer.requests"), s.value, s.key)

    def close(self) -> None:
        self.producer.close()

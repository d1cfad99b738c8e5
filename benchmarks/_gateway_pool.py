"""Several `mint gateway` processes behind one round-robin balancer (benchmarks/_round_robin.py),
and :class:`Faults`: a thread that does harm every ``every_s`` (SIGKILL a gateway and start it
again on its port, SIGKILL the trainer worker and start it again, kill Kafka for a few seconds):
what a Deployment of gateway replicas behind a Service lives through when pods die."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._harness import start_gateway, wait_ready
from benchmarks._round_robin import RoundRobin


class GatewayPool:
    def __init__(self, settings, logs: Path, model: Path, count: int) -> None:
        self.settings, self.logs, self.model = settings, logs, model
        self.procs: list = []
        self.urls: list[str] = []
        for i in range(count):
            proc, url = start_gateway(settings, self._log(i), model, name=f"bench-gw{i}")
            self.procs.append(proc)
            self.urls.append(url)
        for i, url in enumerate(self.urls):
            wait_ready(url, self.procs[i], self._log(i))
        self.balancer = RoundRobin(self.urls).start()
        self.kills = 0

    @property
    def url(self) -> str:
        return self.balancer.url

    def _log(self, i: int) -> Path:
        return self.logs / f"gateway-{i}.log"

    def kill_and_restart(self, i: int) -> None:
        """SIGKILL instance ``i`` (no shutdown of any kind), then start it again on its port."""
        os.killpg(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait(timeout=30)
        self.kills += 1
        port = int(self.urls[i].rsplit(":", 1)[1])
        proc, _ = start_gateway(
            self.settings, self._log(i), self.model, port=port, name=f"bench-gw{i}"
        )
        self.procs[i] = proc
        wait_ready(self.urls[i], proc, self._log(i))

    def kill_next(self) -> None:
        """Kill the instances one after the other, one a call."""
        self.kill_and_restart(self.kills % len(self.procs))

    def close(self) -> None:
        self.balancer.stop()
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)


class Faults:
    """Calls ``harm()`` every ``every_s`` seconds on a thread of its own, until closed."""

    def __init__(self, harm: Callable[[], None], every_s: float) -> None:
        self.harm, self.every_s, self.count = harm, every_s, 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.harm()
            except Exception as e:  # the benchmark reports it and stops harming
                self.error = f"{type(e).__name__}: {e}"
                print(f"fault failed: {self.error}", file=sys.stderr)
                return
            self.count += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def kill_trainer(workers) -> Callable[[], None]:
    """SIGKILL the trainer worker and start it again (it resumes from its checkpoints)."""

    def harm() -> None:
        workers.stop("trainer", sig=signal.SIGKILL)
        workers.start_worker("trainer")

    return harm


def kill_kafka(settings, down_s: float = 3.0) -> Callable[[], None]:
    """SIGKILL the broker, leave it down ``down_s``, start it again (mint dev's launcher, with
    the settings that started it: its state folder holds the pid)."""
    from mint.dev import launcher

    def harm() -> None:
        if launcher.kill(settings, "kafka") is None:
            raise RuntimeError("no broker of `mint dev up` to kill under these settings")
        time.sleep(down_s)
        launcher.up(settings, only=("kafka",))

    return harm

"""Several `mint gateway` processes behind one round-robin balancer (benchmarks/_round_robin.py),
and a killer that SIGKILLs one of them every ``every_s`` and starts it again on its port: what a
Deployment of gateway replicas behind a Service lives through when pods die."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from benchmarks._round_robin import RoundRobin
from benchmarks.gateway_latency import start_gateway, wait_ready


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
        self._stop = threading.Event()
        self._killer: threading.Thread | None = None

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

    def kill_every(self, every_s: float) -> None:
        """From now on, one instance after the other is killed every ``every_s`` seconds."""

        def run() -> None:
            i = 0
            while not self._stop.wait(every_s):
                self.kill_and_restart(i % len(self.procs))
                i += 1

        self._killer = threading.Thread(target=run, name="gateway-killer", daemon=True)
        self._killer.start()

    def close(self) -> None:
        self._stop.set()
        if self._killer is not None:
            self._killer.join(timeout=120)
        self.balancer.stop()
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)

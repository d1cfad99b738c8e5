"""Helpers for the lifecycle tests: workers as real processes, conditions to wait for."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def worker_env(settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MINT_TOPIC_PREFIX": settings.topic_prefix,
            "MINT_KEYSPACE": settings.keyspace,
            "MINT_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "MINT_TOPIC_PARTITIONS": str(settings.topic_partitions),
            "MINT_STATE_DIR": str(settings.state_dir),
            "MINT_STORE_URI": str(settings.adapter_store_root),
            "MINT_LOG_FORMAT": "json",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


class Proc:
    """A `mint worker …` process in its own process group, with its output in a file."""

    def __init__(self, settings, log: Path, *args: str, **env: str) -> None:
        self.log = log
        self.out = log.open("ab")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "mint.cli", "--log-format", "json", "worker", *args],
            env=worker_env(settings, **env),
            cwd=ROOT,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill9(self) -> None:
        os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(timeout=30)

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.p.pid, signal.SIGKILL)  # what it spawned, if anything is left
        self.out.close()

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def wait_until(predicate, timeout_s: float, what: str, proc: Proc | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {what}"
                + (f"; worker log ends:\n{proc.tail()}" if proc else "")
            )
        time.sleep(0.2)

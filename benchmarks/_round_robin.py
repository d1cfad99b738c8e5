"""A small HTTP load balancer for benchmarks and tests: each request goes to the next backend in
turn (no affinity), as a Kubernetes Service spreads requests over gateway replicas.

A backend that refuses the connection (a killed instance) is skipped for the next one, as a
balancer's health check would; a request that was sent and then lost (the instance died while it
ran) is answered 502, which clients retry. ``counts`` says how many requests each backend served.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class RoundRobin:
    def __init__(self, backends: list[str], *, timeout_s: float = 120.0) -> None:
        self.backends = list(backends)
        self.timeout_s = timeout_s
        self.counts = {b: 0 for b in self.backends}
        self.lost = 0  # requests sent to a backend that died before answering (answered 502)
        self._turn = itertools.count()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        url_path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        first = next(self._turn)
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            for i in range(len(self.backends)):
                backend = self.backends[(first + i) % len(self.backends)]
                try:
                    got = await client.request(
                        request.method, backend + url_path, content=body, headers=headers
                    )
                except httpx.ConnectError:
                    continue  # not listening: the next one
                except httpx.TransportError:
                    self.lost += 1
                    return Response(b"backend lost the request", status_code=502)
                self.counts[backend] += 1
                out = {k: v for k, v in got.headers.items() if k.lower() not in HOP_HEADERS}
                out.pop("content-encoding", None)  # httpx decoded the body
                return Response(got.content, status_code=got.status_code, headers=out)
        return Response(b"no backend is up", status_code=503, headers={"Retry-After": "1"})

    def start(self) -> RoundRobin:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "PUT", "DELETE"])]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="round-robin", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)

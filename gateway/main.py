"""``mint gateway``: one instance over Cassandra (keys, policies) and Kafka (the engines)."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import structlog

from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.service import Gateway
from schemas.settings import MintSettings

if TYPE_CHECKING:
    from gateway.tinker.service import TinkerApi
    from gateway.tinker.shared import SharedCalls
    from gateway.tokenize import Tokenizers

log = structlog.get_logger()


def build(settings: MintSettings, config: GatewayConfig) -> Gateway:
    """A gateway on the settings' Cassandra and Kafka (connects to Cassandra now; follows the
    answers once started)."""
    from catalog.access import AccessRepository
    from catalog.cluster import connect
    from catalog.repository import CatalogRepository
    from catalog.tinker_calls import TinkerCalls
    from gateway.directory import CatalogDirectory
    from gateway.dispatch import KafkaEngines
    from streams.topics import ensure_topics

    ensure_topics(
        settings,
        ["infer.requests", "infer.results", "infer.deltas", "train.steps", "train.step.results"],
    )
    cluster, session = connect(settings)
    try:
        directory = CatalogDirectory(
            CatalogRepository(session, settings.keyspace),
            AccessRepository(session, settings.keyspace),
        )
        metrics = GatewayMetrics()
        engines = KafkaEngines(
            settings, config.instance_id, metrics, retry_after_s=config.retry_after_s
        )
    except BaseException:
        cluster.shutdown()
        raise
    gw = Gateway(config, directory, engines, metrics=metrics, on_close=cluster.shutdown)
    gw.tinker = tinker_api(settings, gw, TinkerCalls(session, settings.keyspace))
    gw.tokenizers = tokenizers(settings, config)
    return gw


def tokenizers(settings: MintSettings, config: GatewayConfig) -> Tokenizers:
    """The base models' tokenizers, from their local folders (gateway.tokenize.locate)."""
    from gateway.tokenize import Tokenizers, locate

    return Tokenizers(
        lambda base: locate(base, settings.models_dir, settings.base_model or None),
        max_model_len=config.max_model_len,
    )


def tinker_api(settings: MintSettings, gw: Gateway, shared: SharedCalls) -> TinkerApi:
    """The Tinker API of ``gw``: calls to the trainer on ``train.steps``, answers followed on
    ``train.step.results``, what all instances share in ``shared`` (the catalog's rows); it
    trains and samples this deployment's base model."""
    from gateway.tinker.service import TinkerApi
    from gateway.tinker.trainer import KafkaTrainer

    cfg = gw.config
    trainer = KafkaTrainer(settings, cfg.instance_id, retry_after_s=cfg.retry_after_s)
    return TinkerApi(gw, trainer, [settings.base_model], shared=shared)


def serve(settings: MintSettings, config: GatewayConfig) -> None:
    """Run one instance in the foreground until SIGTERM/SIGINT (uvicorn handles both)."""
    import uvicorn

    from gateway.app import create_app

    app = create_app(build(settings, config))
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        access_log=False,
        proxy_headers=True,
        timeout_graceful_shutdown=10,
    )


class ThreadedServer:
    """An instance served from a thread of this process (tests and benchmarks): ``start()``
    returns once it follows the answers and listens; ``url`` is its base URL."""

    def __init__(self, gateway: Gateway) -> None:
        import uvicorn

        from gateway.app import create_app

        self.gateway = gateway
        cfg = gateway.config
        port = cfg.port or _free_port(cfg.host)
        self.url = f"http://{cfg.host}:{port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(gateway), host=cfg.host, port=port, log_config=None, access_log=False
            )
        )
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 60.0) -> ThreadedServer:
        self._thread = threading.Thread(target=self.server.run, name="gateway-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gateway at {self.url} did not start within {timeout_s} s")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]

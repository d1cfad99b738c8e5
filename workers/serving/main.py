"""Entry points: build one engine and its working set, then run the serving or rollout loop.

``mint worker serving`` / ``mint worker rollout`` call these; they must run in a process's main
module guard (vLLM spawns its engine core), which console scripts are.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from catalog.artifacts import model_fingerprint
from catalog.cluster import connect
from catalog.repository import CatalogRepository
from catalog.store import AdapterStore
from schemas.logs import configure_logging
from schemas.settings import MintSettings
from streams import health
from streams.records import stop_on_signals
from streams.topics import ensure_topics
from workers.serving.core import ServingCore
from workers.serving.engine import EngineConfig, VllmEngine
from workers.serving.resolution import ResolutionCache
from workers.serving.rollout import RolloutCore, run_rollout_worker
from workers.serving.worker import ServingWorker
from workers.serving.working_set import WorkingSet

log = structlog.get_logger()


def build(settings: MintSettings, config: EngineConfig, cache_dir: Path, ttl_s: float = 2.0):
    """(engine, working set, resolver, store, cassandra cluster) for one worker process."""
    ensure_topics(settings)
    cluster, session = connect(settings)
    repo = CatalogRepository(session, settings.keyspace)
    store = AdapterStore.from_settings(settings)
    engine = VllmEngine(config)
    ws = WorkingSet(
        engine,
        store,
        cache_dir,
        base_model_fingerprint=model_fingerprint(config.model),
        max_loras=config.max_loras,
        max_cpu_loras=config.max_cpu_loras,
        max_disk_loras=config.max_disk_loras,
        max_lora_rank=config.max_lora_rank,
    )
    return engine, ws, ResolutionCache(repo.resolve, ttl_s=ttl_s), store, cluster


def serve_main(
    settings: MintSettings,
    config: EngineConfig,
    cache_dir: Path,
    base_model: str,
    *,
    fifo: bool = False,
):
    configure_logging(settings.log_level, settings.log_format)
    health.serve(settings.metrics_port)  # up while the engine starts (MINT_METRICS_PORT)
    engine, ws, resolver, _, cluster = build(settings, config, cache_dir)
    core = ServingCore(
        engine,
        ws,
        resolver,
        engine_id=config.engine_id,
        base_model=base_model,
        max_num_seqs=config.max_num_seqs,
        fifo=fifo,
    )
    try:
        worker = ServingWorker(settings, core, stop=stop_on_signals(), instance_id=config.engine_id)
        stats = worker.run()
        log.info("serving worker stopped", **stats, **ws.counters.as_dict())
    finally:
        engine.close()
        cluster.shutdown()


def rollout_main(settings: MintSettings, config: EngineConfig, cache_dir: Path):
    configure_logging(settings.log_level, settings.log_format)
    health.serve(settings.metrics_port)
    engine, ws, resolver, store, cluster = build(settings, config, cache_dir)
    core = RolloutCore(engine, ws, resolver, store, engine_id=config.engine_id)
    try:
        run_rollout_worker(settings, core, stop=stop_on_signals())
    finally:
        engine.close()
        cluster.shutdown()

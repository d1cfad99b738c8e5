"""``mint worker evaluator``: one engine; evaluation alone, or with serving and rollout on it."""

from __future__ import annotations

from pathlib import Path

import structlog

from catalog.state import StateTable
from schemas.logs import configure_logging
from schemas.settings import MintSettings
from streams import health
from streams.records import stop_on_signals
from workers.controller.logic import CONFIGS_STATE
from workers.evaluator.core import EvaluatorCore
from workers.evaluator.worker import EngineHost, run_evaluator_worker
from workers.serving.engine import EngineConfig
from workers.serving.main import build

log = structlog.get_logger()


def evaluator_main(
    settings: MintSettings,
    config: EngineConfig,
    cache_dir: Path,
    *,
    with_serving: bool = False,
    with_rollout: bool = False,
    base_model_name: str | None = None,
) -> None:
    configure_logging(settings.log_level, settings.log_format)
    health.serve(settings.metrics_port)  # up while the engine starts (MINT_METRICS_PORT)
    engine, ws, resolver, store, cluster = build(settings, config, cache_dir)
    # Each policy's configured suite, as the controller read it from policy.config.
    configs = StateTable(cluster.connect(), settings.keyspace, CONFIGS_STATE)
    evaluator = EvaluatorCore(engine, ws, resolver, engine_id=config.engine_id, configs=configs)
    stop = stop_on_signals()
    try:
        if not (with_serving or with_rollout):
            run_evaluator_worker(settings, evaluator, stop=stop)
            return
        from workers.serving.core import ServingCore
        from workers.serving.rollout import RolloutCore
        from workers.serving.worker import ServingWorker

        serving = None
        if with_serving:
            core = ServingCore(
                engine,
                ws,
                resolver,
                engine_id=config.engine_id,
                base_model=base_model_name or config.model,
                max_num_seqs=config.max_num_seqs,
            )
            serving = ServingWorker(settings, core, stop=stop, instance_id=config.engine_id)
        rollout = (
            RolloutCore(engine, ws, resolver, store, engine_id=config.engine_id)
            if with_rollout
            else None
        )
        host = EngineHost(
            settings,
            serving=serving,
            rollout=rollout,
            evaluator=evaluator,
            engine_id=config.engine_id,
            stop=stop,
        )
        log.info("engine host stopped", **host.run())
    finally:
        engine.close()
        cluster.shutdown()

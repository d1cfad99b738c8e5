"""`mint worker …`: run one long-lived worker (projector, trainer, serving, …) in the foreground."""

from __future__ import annotations

import click


@click.group("worker")
def worker() -> None:
    """Run one MinT worker in the foreground (a consumer-group member; start more to scale out)."""


@worker.command("projector")
@click.option(
    "--migrate/--no-migrate",
    "auto_migrate",
    default=False,
    help="Apply pending catalog migrations before consuming.",
)
@click.option(
    "--parallel",
    default=16,
    help="policies applied at once (each policy's events stay in order)",
)
def projector(auto_migrate: bool, parallel: int) -> None:
    """Apply export and alias-moved events to the Cassandra catalog (group <prefix>-catalog-projector)."""
    from workers.projector import main

    main(auto_migrate=auto_migrate, parallel=parallel)


@worker.command("router")
@click.option(
    "--parallel",
    default=8,
    help="policies copied at once (each policy's answers stay in order)",
)
def router(parallel: int) -> None:
    """Copy each answer of infer.results to its tenant's topic
    <prefix>.tenant.<tenant>.infer.results (group <prefix>-tenant-router), which only that
    tenant's downstream principal may read (`mint security tenant`)."""
    from workers.router import main

    main(parallel=parallel)


@worker.command("trainer")
@click.option(
    "--base-model", default=None, help="Model folder to keep resident (default: MINT_BASE_MODEL)."
)
@click.option(
    "--backend",
    type=click.Choice(["torch", "deepspeed"]),
    default="torch",
    help="Optimizer backend: plain torch AdamW or DeepSpeed ZeRO-2.",
)
@click.option(
    "--consumers",
    type=int,
    default=1,
    help="Consumer threads sharing the one resident base (policies train while others wait).",
)
@click.option(
    "--ranks",
    type=click.IntRange(min=1),
    default=1,
    help="Data-parallel ranks (DeepSpeed ZeRO-2; needs --backend deepspeed). Rank 0 starts "
    "ranks 1..N-1 on this machine, unless a launcher set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.",
)
def trainer(base_model: str | None, backend: str, consumers: int, ranks: int) -> None:
    """Train LoRA updates from update.requests; export, register and announce revisions."""
    if ranks > 1 and backend != "deepspeed":
        raise click.UsageError(
            f"--ranks {ranks} needs --backend deepspeed: only ZeRO-2 partitions the optimizer "
            "state and gradients across ranks (the torch backend runs one rank)"
        )
    from workers.trainer.worker import main

    main(base_model=base_model, backend=backend, consumers=consumers, ranks=ranks)


def _engine_options(fn):
    opts = [
        click.option(
            "--base-model",
            "--model",
            "model",
            default=None,
            help="base model folder (MINT_BASE_MODEL)",
        ),
        click.option("--engine-id", default="engine-0"),
        click.option("--max-loras", default=4, help="GPU slots"),
        click.option("--max-cpu-loras", default=16, help="CPU cache"),
        click.option("--max-disk-loras", default=1024, help="disk cache"),
        click.option("--max-lora-rank", default=16),
        click.option("--max-model-len", default=2048),
        click.option(
            "--max-num-seqs",
            default=32,
            help="sequences decoded together (a rollout of 16 prompts × 8 is 128)",
        ),
        click.option("--dtype", default="auto"),
        click.option("--cache-dir", type=click.Path(), default=None, help="local adapter cache"),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _engine_config(
    settings,
    model,
    engine_id,
    max_loras,
    max_cpu_loras,
    max_disk_loras,
    max_lora_rank,
    max_model_len,
    max_num_seqs,
    dtype,
    cache_dir,
):
    from pathlib import Path

    from workers.serving.engine import EngineConfig

    model = model or settings.base_model
    if not model:
        raise click.UsageError("give --model DIR or set MINT_BASE_MODEL to the base model folder")
    config = EngineConfig(
        model=model,
        engine_id=engine_id,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
        max_disk_loras=max_disk_loras,
        max_lora_rank=max_lora_rank,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        dtype=dtype,
    )
    cache = Path(cache_dir) if cache_dir else settings.state_dir / "adapter-cache" / engine_id
    return config, cache


@worker.command("serving")
@_engine_options
@click.option("--base-model-name", default=None, help="base model name in the catalog")
@click.option(
    "--fifo",
    is_flag=True,
    help="run requests in arrival order instead of demand-ordered waves (a baseline)",
)
def serving(base_model_name, fifo, **opts) -> None:
    """Serve inference requests (infer.requests → infer.results) with one vLLM engine.

    Engines of one deployment form the consumer group <prefix>-serving: each serves the
    partitions (policies) it is assigned and loads their cold adapters itself. Give every engine
    its own --engine-id: it is the engine's static group membership, so a restarted engine takes
    its partitions back; two live engines with one id fence each other.
    """
    from schemas.settings import get_settings
    from workers.serving.main import serve_main

    settings = get_settings()
    config, cache = _engine_config(settings, **opts)
    serve_main(settings, config, cache, base_model_name or config.model, fifo=fifo)


@worker.command("rollout")
@_engine_options
def rollout(**opts) -> None:
    """Sample rollouts (rollout.requests → rollout.results, claim checks in the store)."""
    from schemas.settings import get_settings
    from workers.serving.main import rollout_main

    settings = get_settings()
    config, cache = _engine_config(settings, **opts)
    rollout_main(settings, config, cache)


@worker.command("evaluator")
@_engine_options
@click.option("--with-serving", is_flag=True, help="Also serve infer.requests on this engine.")
@click.option("--with-rollout", is_flag=True, help="Also sample rollout.requests on this engine.")
@click.option("--base-model-name", default=None, help="base model name in the catalog")
def evaluator(with_serving: bool, with_rollout: bool, base_model_name, **opts) -> None:
    """Evaluate revisions (eval.requests → eval.results) on one vLLM engine.

    \b
    Each request names a suite (prompts + a reward from the rollout reward registry, see
    workers/evaluator/suites.py) and a revision; the worker generates the suite's prompts with
    that revision's adapter and publishes eval.completed with the metrics and the gate's verdict.
    On a small machine run ONE engine for everything:
      mint worker evaluator --with-serving --with-rollout --model DIR
    """
    from schemas.settings import get_settings
    from workers.evaluator.main import evaluator_main

    settings = get_settings()
    config, cache = _engine_config(settings, **opts)
    evaluator_main(
        settings,
        config,
        cache,
        with_serving=with_serving,
        with_rollout=with_rollout,
        base_model_name=base_model_name,
    )


@worker.command("controller")
def controller() -> None:
    """Run the lifecycle controller (one consumer group; per-policy state in Cassandra).

    \b
    It reacts to events and emits the next step of each policy's lifecycle:
      export.completed  -> eval.requested        (policies configured to auto-evaluate)
      eval.completed    -> serving.promote       (the gate: every threshold met)
      eval.completed    -> serving.rollback      (the serving revision regressed)
      serving.promote / serving.rollback -> alias.moved (compare-and-set on the catalog),
                                            or serving.refused with the reason
    Configure a policy with `mint policies configure`; scale out by starting more.
    """
    from workers.controller.worker import main

    main()


COMMANDS: list[click.Command] = [worker]

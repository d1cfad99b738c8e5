"""Issue 27: `mint worker serving|rollout` engine settings from flags, else MINT_ENGINE_*, else
CPU defaults, reach EngineConfig; a bad value is a usage error that names its flag."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mint.commands.workers import worker

ENV = (
    "MAX_MODEL_LEN",
    "GPU_MEMORY_UTILIZATION",
    "ENFORCE_EAGER",
    "MAX_LORAS",
    "MAX_CPU_LORAS",
    "MAX_LORA_RANK",
    "TENSOR_PARALLEL_SIZE",
    "ENABLE_CHUNKED_PREFILL",
    "MAX_NUM_SEQS",
    "DTYPE",
)


@pytest.fixture
def built(monkeypatch) -> dict:
    """The EngineConfig each command would build its engine from (the entry points faked)."""
    for name in ENV:  # the developer's shell must not leak into the defaults
        monkeypatch.delenv(f"MINT_ENGINE_{name}", raising=False)
    import workers.serving.main as entry

    seen: dict = {}

    def serve_main(settings, config, cache, base_model_name, fifo=False) -> None:
        seen["serving"] = config

    def rollout_main(settings, config, cache) -> None:
        seen["rollout"] = config

    monkeypatch.setattr(entry, "serve_main", serve_main)
    monkeypatch.setattr(entry, "rollout_main", rollout_main)
    return seen


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(worker, list(args), env=env, catch_exceptions=False)


@pytest.mark.parametrize("command", ["serving", "rollout"])
def test_defaults_run_on_cpu(built, command) -> None:
    res = invoke(command, "--model", "/models/m")
    assert res.exit_code == 0, res.output
    c = built[command]
    assert (c.max_model_len, c.max_num_seqs, c.max_loras, c.max_cpu_loras) == (2048, 32, 4, 16)
    assert c.gpu_memory_utilization == 0.3 and c.tensor_parallel_size == 1
    assert c.enforce_eager is True and c.enable_chunked_prefill is False


@pytest.mark.parametrize("command", ["serving", "rollout"])
def test_flags_reach_the_engine_config(built, command) -> None:
    res = invoke(
        command,
        *("--model", "/models/m", "--max-model-len", "8192", "--gpu-memory-utilization", "0.9"),
        *("--no-enforce-eager", "--max-loras", "16", "--max-cpu-loras", "128"),
        *("--max-lora-rank", "64", "--tensor-parallel-size", "4", "--enable-chunked-prefill"),
        *("--max-num-seqs", "256", "--dtype", "bfloat16"),
    )
    assert res.exit_code == 0, res.output
    c = built[command]
    assert (c.max_model_len, c.gpu_memory_utilization, c.enforce_eager) == (8192, 0.9, False)
    assert (c.max_loras, c.max_cpu_loras, c.max_lora_rank) == (16, 128, 64)
    assert (c.tensor_parallel_size, c.enable_chunked_prefill) == (4, True)
    assert (c.max_num_seqs, c.dtype) == (256, "bfloat16")


def test_the_environment_is_the_fallback_and_a_flag_wins(built) -> None:
    env = {
        "MINT_ENGINE_MAX_MODEL_LEN": "4096",
        "MINT_ENGINE_GPU_MEMORY_UTILIZATION": "0.85",
        "MINT_ENGINE_ENFORCE_EAGER": "false",
        "MINT_ENGINE_MAX_LORAS": "8",
        "MINT_ENGINE_MAX_CPU_LORAS": "64",
        "MINT_ENGINE_MAX_LORA_RANK": "32",
        "MINT_ENGINE_TENSOR_PARALLEL_SIZE": "2",
        "MINT_ENGINE_ENABLE_CHUNKED_PREFILL": "1",
        "MINT_ENGINE_MAX_NUM_SEQS": "128",
        "MINT_ENGINE_DTYPE": "float16",
    }
    assert invoke("rollout", "--model", "/models/m", env=env).exit_code == 0
    c = built["rollout"]
    assert (c.max_model_len, c.gpu_memory_utilization, c.enforce_eager) == (4096, 0.85, False)
    assert (c.max_loras, c.max_cpu_loras, c.max_lora_rank) == (8, 64, 32)
    assert (c.tensor_parallel_size, c.enable_chunked_prefill) == (2, True)
    assert (c.max_num_seqs, c.dtype) == (128, "float16")
    res = invoke("rollout", "--model", "/models/m", "--max-model-len", "1024", env=env)
    assert res.exit_code == 0 and built["rollout"].max_model_len == 1024


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (("--max-loras", "many"), {}, ("--max-loras", "'many' is not a valid integer")),
        (("--gpu-memory-utilization", "1.5"), {}, ("--gpu-memory-utilization", "1.5")),
        (("--gpu-memory-utilization", "0"), {}, ("--gpu-memory-utilization",)),
        (("--tensor-parallel-size", "0"), {}, ("--tensor-parallel-size",)),
        (("--dtype", "fp8"), {}, ("--dtype", "fp8")),
        ((), {"MINT_ENGINE_MAX_MODEL_LEN": "big"}, ("MINT_ENGINE_MAX_MODEL_LEN", "big")),
        ((), {"MINT_ENGINE_ENFORCE_EAGER": "maybe"}, ("MINT_ENGINE_ENFORCE_EAGER", "maybe")),
        # A check across fields (EngineConfig's own) names the settings it compares.
        (("--max-loras", "8", "--max-cpu-loras", "4"), {}, ("max_cpu_loras=4", "max_loras=8")),
        (("--engine-id", "no spaces"), {}, ("--engine-id",)),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_setting(built, args, env, names) -> None:
    res = invoke("serving", "--model", "/models/m", *args, env=env)
    assert res.exit_code == 2, res.output
    for name in names:
        assert name in res.output
    assert "Traceback" not in res.output and "serving" not in built

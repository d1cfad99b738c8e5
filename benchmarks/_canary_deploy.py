"""The deployment of benchmarks/canary.py: one run's topics and keyspace, the tiny Llama with a
chat template, two policies with two stored revisions each, a tenant and its API key, and the
processes (one ``mint worker serving`` engine, the controller, the projector, ``mint gateway``);
commands to the controller and what answered them on ``serving.events``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import _engine_group as eg
from benchmarks._canary_traffic import EventLog
from schemas.settings import MintSettings

TENANT = eg.TENANT
POLICIES = ("canary-better", "canary-worse")
SUITE = "toy-even"  # a configuration names one; nothing evaluates here (auto_evaluate off)
# A small ChatML-like template (as tests/e2e/gateway): the tiny test tokenizer has none.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def chat_model(settings: MintSettings, out: Path) -> Path:
    """The tiny test Llama (``models_dir/llama-test``) copied to ``out`` with a chat template,
    so that chat completions render."""
    from transformers import AutoTokenizer

    shutil.copytree(eg.tiny_model(settings), out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return out


class Deployment:
    def __init__(self, settings: MintSettings, work: Path) -> None:
        self.settings, self.work = settings, work
        self.logs = work / "logs"
        self.side: Any = None  # mint.dev.workers.Workers: controller, projector
        self.engines: eg.EngineGroup | None = None
        self.gateway: subprocess.Popen | None = None
        self.url = self.key = ""
        self.events: EventLog = None  # type: ignore[assignment]
        self.producer: Any = None
        self.cluster: Any = None
        self.session: Any = None

    def start(self) -> None:
        """Everything up: the engine starts first (the slowest) and the rest beside it."""
        from benchmarks._harness import start_gateway, wait_ready
        from catalog.cluster import connect
        from mint.dev.workers import Workers
        from streams.producer import EventProducer

        eg.prepare(self.settings)
        model = chat_model(self.settings, self.work / "llama-chat")
        self.engines = eg.EngineGroup(
            self.settings,
            model,
            self.logs,
            max_loras=2,
            max_cpu_loras=8,
            max_num_seqs=16,
            threads=min(4, max(1, (os.cpu_count() or 2) // 2)),
        )
        self.engines.start("e1")
        self.side = Workers(self.settings, model, self.logs)
        self.side.start_worker("projector")
        self.side.start_worker("controller")
        self.events = EventLog(self.settings)  # at the end now: before any command is sent
        self.producer = EventProducer(self.settings, client_id="bench-canary")
        self.cluster, self.session = connect(self.settings)
        with eg.console.status("storing revisions, importing the catalog"):
            self.catalog(model)
        self.gateway, self.url = start_gateway(self.settings, self.logs / "gateway.log", model)
        with eg.console.status("waiting for the engine to join its group"):
            self.engines.wait_members(["e1"])
        wait_ready(self.url, self.gateway, self.logs / "gateway.log")

    def catalog(self, model: Path) -> None:
        """Revisions 1 and 2 of each policy (distinct random adapters), no alias yet; a tenant
        without a rate limit and its key."""
        from benchmarks._adapters import import_rows
        from benchmarks._poison_lifecycle import store_revisions
        from catalog.access import AccessRepository

        rows = []
        for k, policy in enumerate(POLICIES):
            rows += store_revisions(self.settings, model, self.work, TENANT, policy, 2, 100 * k)
        import_rows(self.settings, rows, self.work / "catalog.jsonl")
        access = AccessRepository(self.session, self.settings.keyspace)
        access.create_tenant(TENANT, rate_per_s=1e6, burst=1_000_000, by="bench")
        key, _ = access.create_key(TENANT, name="bench", by="bench")
        self.key = key.text

    def check(self) -> None:
        """Raise (with its log's tail) when a process of the deployment exited."""
        self.side.check()
        assert self.engines is not None
        self.engines.check()
        if self.gateway is not None and self.gateway.poll() is not None:
            tail = (self.logs / "gateway.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mint gateway exited with {self.gateway.returncode}: {tail}")

    # ---------------------------------------------------------------- commands

    def send(self, policy: str, payload: Any) -> Any:
        from schemas import make_event

        env = make_event(payload, tenant=TENANT, policy=policy, producer="bench/canary")
        self.producer.publish(env)
        return env

    def command(self, policy: str, payload: Any, want: str, timeout_s: float = 60.0):
        """Send a serving command; (its ``want`` answer, when this client saw it). A refusal
        or no answer raises, naming the command and the reason."""
        cmd = self.send(policy, payload)
        got = self.events.wait(
            lambda e: e.causation_id == cmd.event_id and e.type in (want, "serving.refused"),
            timeout_s,
            self.check,
        )
        if got is None:
            raise RuntimeError(
                f"no {want} for {cmd.type} of {TENANT}/{policy} within {timeout_s:.0f} s "
                f"(see the controller's log under {self.logs})"
            )
        if got[0].type == "serving.refused":
            raise RuntimeError(f"{cmd.type} of {TENANT}/{policy} refused: {got[0].payload.reason}")
        return got

    def configure(self, policy: str, rule: Any, timeout_s: float = 60.0) -> None:
        """``policy.configured`` with the canary rule, nothing automatic; returns once the
        controller stored it (a canary is judged by the rule it holds)."""
        from catalog.state import StateTable
        from schemas.events import PolicyConfigured
        from workers.controller.logic import CONFIGS_STATE

        self.send(
            policy,
            PolicyConfigured(
                base_model=eg.BASE_MODEL,
                suite=SUITE,
                auto_evaluate=False,
                auto_promote=False,
                canary=rule,
                requested_by="bench",
            ),
        )
        table = StateTable(self.session, self.settings.keyspace, CONFIGS_STATE)
        want = rule.model_dump(mode="json")
        deadline = time.monotonic() + timeout_s
        while True:
            cfg = table.get(f"{TENANT}/{policy}") or {}
            if cfg.get("suite") == SUITE and cfg.get("canary", want) == want:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the controller did not store the configuration of {TENANT}/{policy} "
                    f"within {timeout_s:.0f} s (see its log under {self.logs})"
                )
            self.check()
            time.sleep(0.3)

    def prod(self, policy: str) -> int | None:
        from catalog.repository import CatalogRepository

        repo = CatalogRepository(self.session, self.settings.keyspace)
        return repo.get_alias(TENANT, policy, "prod").revision

    # ---------------------------------------------------------------- the end

    def close(self, *, keep: bool = False, keep_logs: bool = False) -> None:
        """Stop every process; drop the run's topics, keyspace and work dir unless ``keep``
        (``keep_logs``: the worker logs stay, e.g. of a failed run)."""
        if self.gateway is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.gateway.pid, signal.SIGTERM)
            try:
                self.gateway.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.gateway.pid, signal.SIGKILL)
        if self.engines is not None:
            self.engines.close()
        if self.side is not None:
            self.side.stop_all()
        for closer in (self.events, self.producer):
            if closer is not None:
                with contextlib.suppress(Exception):
                    closer.close()
        if self.cluster is not None:
            self.cluster.shutdown()
        if keep:
            eg.say(f"kept {self.work} and the topics under prefix {self.settings.topic_prefix}")
            return
        with contextlib.suppress(Exception):
            eg.delete_topics(self.settings)
        with contextlib.suppress(Exception):
            eg.drop_keyspace(self.settings)
        if not keep_logs:
            shutil.rmtree(self.work, ignore_errors=True)
            return
        eg.say(f"worker logs kept in {self.logs}")
        for sub in self.work.iterdir():
            if sub.name != "logs":
                shutil.rmtree(sub, ignore_errors=True)

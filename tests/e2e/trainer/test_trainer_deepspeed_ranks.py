"""DeepSpeed ZeRO-2 on two data-parallel ranks (workers/trainer/ranks.py), gloo on CPU.

Stated tolerance: after the same steps on the same data, two ranks' adapter weights equal one
rank's within 1e-5 absolute (fp32; only the order in which gradients are added differs; seen
up to 6e-6 after 12 steps at lr 1e-2). Each rank holds half of the one-rank optimizer state
(its ZeRO-2 partition), within 0.45-0.55 of it. Rank 0 here is always a child process: this
test process may already hold a one-rank process group (test_trainer_deepspeed.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

from catalog.claims import write_jsonl
from catalog.repository import CatalogRepository
from catalog.store import AdapterStore
from mint.cli import main as cli
from schemas import make_event
from schemas.events import LoraSpec, UpdateRequested
from streams.producer import EventProducer
from workers.trainer import LoraShape, MultiPolicyTrainer, Rollout, SftExample, TrainerConfig

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = 1e-5
TENANT, POLICY = "acme", "ranks"
SFT = [
    {"prompt": f"question: {i} plus {i} equals? answer:", "completion": f" {2 * i}"}
    for i in range(8)
]
RL = [
    {
        "prompt": f"count to {i // 4}:",
        "completion": " 1 2 3"[: 2 + 2 * (i % 4)],
        "reward": float(i % 4 == i // 4),
        "group": i // 4,
    }
    for i in range(8)
]


def test_benchmark_smoke_two_ranks_equal_one_and_each_holds_half(tiny_llama: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "deepspeed_ranks.py"),
            "--smoke",
            "--model",
            str(tiny_llama),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout
    result = json.loads(lines[0])
    assert result["benchmark"] == "deepspeed_ranks" and result["ranks"] == 2
    assert result["max_lora_b"] > 1e-3, result  # it trained (LoRA B starts at zero)
    assert result["max_weight_diff"] <= TOLERANCE, result
    assert len(result["ratio_per_rank"]) == 2
    assert all(0.45 <= r <= 0.55 for r in result["ratio_per_rank"]), result
    # Partitioned, not dropped: the ranks together hold at least the one-rank state.
    assert sum(result["optimizer_bytes_per_rank"]) >= result["optimizer_bytes_one_rank"]
    assert result["met"] is True


def test_cli_offers_ranks_and_refuses_them_without_deepspeed() -> None:
    runner = CliRunner()
    shown = runner.invoke(cli, ["worker", "trainer", "--help"])
    assert shown.exit_code == 0 and "--ranks" in shown.output
    refused = runner.invoke(cli, ["worker", "trainer", "--ranks", "2", "--backend", "torch"])
    assert refused.exit_code == 2 and "needs --backend deepspeed" in refused.output
    zero = runner.invoke(cli, ["worker", "trainer", "--ranks", "0", "--backend", "deepspeed"])
    assert zero.exit_code == 2


# The worker: `mint worker trainer --backend deepspeed --ranks 2` against Kafka and Cassandra.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(base: Path, data_uri: str, parent: int | None, objective: str):
    payload = UpdateRequested(
        base_model=str(base),
        parent_revision=parent,
        objective=objective,
        data_uri=data_uri,
        steps=3,
        batch_size=8,
        learning_rate=1e-2,
        seed=0,
        lora=LoraSpec(rank=8, alpha=16, target_modules=["q_proj", "v_proj"]),
    )
    return make_event(payload, tenant=TENANT, policy=POLICY, producer="sdk/test")


class Worker:
    """`mint worker trainer --backend deepspeed --ranks 2` in its own session, logging JSON:
    rank 0 starting rank 1 itself, or both started by the ``deepspeed`` launcher (the one a
    hostfile drives across machines; here on one node, as it runs on each node)."""

    def __init__(self, settings, base: Path, log: Path, launcher: bool = False) -> None:
        self.log = log
        port = str(_free_port())
        env = {
            **os.environ,
            "MINT_TOPIC_PREFIX": settings.topic_prefix,
            "MINT_KEYSPACE": settings.keyspace,
            "MINT_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "MINT_TOPIC_PARTITIONS": str(settings.topic_partitions),
            "MINT_STORE_URI": str(settings.adapter_store_root),
            "MINT_LOG_FORMAT": "json",
            "MASTER_PORT": port,
            "PYTHONPATH": str(ROOT),
        }
        env.pop("RANK", None)
        mint = [
            sys.executable,
            "-m",
            "mint.cli",
            "worker",
            "trainer",
            "--backend",
            "deepspeed",
            "--ranks",
            "2",
            "--base-model",
            str(base),
        ]
        if launcher:
            mint = [
                str(Path(sys.executable).parent / "deepspeed"),
                "--num_gpus",
                "2",
                "--master_port",
                port,
                "--no_python",
                "--no_local_rank",
                *mint,
            ]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                mint, env=env, cwd=ROOT, stdout=out, stderr=out, start_new_session=True
            )

    def events(self, name: str) -> list[dict]:
        # Both ranks write to one log: two lines written at the same instant can land as
        # '{...}{...}' on one line (seen in ci-local), so decode every object on a line.
        found, decoder = [], json.JSONDecoder()
        for line in self.log.read_text(errors="replace").splitlines():
            at = line.find("{")
            while at != -1:
                try:
                    entry, end = decoder.raw_decode(line, at)
                except ValueError:
                    break
                if isinstance(entry, dict) and entry.get("event") == name:
                    found.append(entry)
                at = line.find("{", end)
        return found

    def wait_for(self, what, timeout_s: float, label: str):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            assert self.proc.poll() is None, (
                f"trainer exited while waiting for {label}:\n{self.tail()}"
            )
            time.sleep(0.5)
        raise AssertionError(f"no {label} within {timeout_s} s:\n{self.tail()}")

    def pids(self) -> dict[int, int]:
        """Each rank's pid, once both are ready (met in the process group)."""
        ready = self.wait_for(
            lambda: len(self.events("trainer_rank_ready")) == 2, 150, "both ranks"
        )
        assert ready
        return {e["rank"]: e["pid"] for e in self.events("trainer_rank_ready")}

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def one_rank(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """What one rank makes of the two requests (the worker's batches: all 8 rows), in-process."""
    out = tmp_path_factory.mktemp("one-rank")
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama), backend="deepspeed"))
    try:
        pid = f"{TENANT}/{POLICY}"
        trainer.add_policy(pid, LoraShape(8, 16, 0.0, ["q_proj", "v_proj"]), seed=0)
        adapters = []
        for rows, step, eos in ((SFT, trainer.sft_step, True), (RL, trainer.rl_step, False)):
            kind = SftExample if eos else Rollout
            batch = trainer.collate([kind(**r) for r in rows], add_eos=eos)
            for _ in range(3):
                step(pid, batch, lr=1e-2)
            trainer.write_adapter(pid, out / str(len(adapters)))
            adapters.append(load_file(str(out / str(len(adapters)) / "adapter_model.safetensors")))
        return adapters
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "launcher", [False, True], ids=["rank0-starts-rank1", "deepspeed-launcher"]
)
def test_worker_on_two_ranks_trains_like_one_rank_and_stops_both(
    settings, live, tiny_llama: Path, tmp_path: Path, one_rank: list[dict], launcher: bool
) -> None:
    store = AdapterStore(settings.adapter_store_root)
    sft = write_jsonl(store, TENANT, POLICY, "data", "sft", SFT)
    rl = write_jsonl(store, TENANT, POLICY, "data", "rl", RL)
    first, second = _request(tiny_llama, sft, None, "sft"), _request(tiny_llama, rl, 1, "rl")
    with EventProducer(settings) as producer:
        producer.publish_many([first, second])
    worker = Worker(settings, tiny_llama, tmp_path / "trainer.log", launcher=launcher)
    try:
        pids = worker.pids()
        repo = CatalogRepository(live, settings.keyspace)

        def two_revisions() -> list | None:
            found = list(repo.iter_revisions(TENANT, POLICY))
            return found if len(found) == 2 else None

        revisions = worker.wait_for(two_revisions, 150, "two revisions")
        assert sorted(r.revision for r in revisions) == [1, 2]
        store = AdapterStore.from_settings(settings)
        for rev in revisions:
            stored = store.open(rev.store_uri, owner=(TENANT, POLICY))
            got = load_file(str(stored.path / "adapter_model.safetensors"))
            want = one_rank[rev.revision - 1]
            assert got.keys() == want.keys()
            diff = max(float((got[k] - want[k]).abs().max()) for k in got)
            assert diff <= TOLERANCE, (rev.revision, diff)
        # SIGTERM to rank 0 alone (rank 1 has its own session, or its own launcher child):
        # rank 0 leaves its group and tells rank 1 to stop.
        os.kill(pids[0], signal.SIGTERM)
        assert worker.proc.wait(timeout=60) == 0, worker.tail()
        assert _gone(pids[1], 30), worker.tail()
        assert worker.events("trainer_rank_stopping"), worker.tail()
        assert not worker.events("trainer_ranks_lost"), worker.tail()
    finally:
        worker.kill()


def test_rank_zero_stops_clearly_when_a_follower_dies(
    settings, live, tiny_llama: Path, tmp_path: Path
) -> None:
    worker = Worker(settings, tiny_llama, tmp_path / "trainer.log")
    try:
        follower = worker.pids()[1]
        os.kill(follower, signal.SIGKILL)
        code = worker.proc.wait(timeout=60)
        assert code == 1, worker.tail()
        lost = worker.events("trainer_ranks_lost")
        assert lost and f"rank 1 (pid {follower}) exited with code -9" in lost[0]["reason"]
        assert "trainer stopped: rank 1" in worker.tail()  # the exit message says why
    finally:
        worker.kill()

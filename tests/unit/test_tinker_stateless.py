"""Issue 40: two gateway instances behind a round-robin balancer serve one official SDK client,
and one of them stopping mid-run loses no model, future or saved state. Each instance is a real
gateway (HTTP, Tinker API); what they share is :class:`MemoryCalls` here (the Cassandra rows of
catalog.tinker_calls in production: tests/integration), and the trainer is a fake that answers
every instance, as ``train.step.results`` reaches every follower."""

from __future__ import annotations

import httpx
import pytest
from tinker import types

from benchmarks._round_robin import RoundRobin
from gateway import GatewayConfig
from gateway.main import ThreadedServer
from gateway.service import Gateway
from gateway.tinker.futures import FuturesTable
from gateway.tinker.service import TinkerApi
from gateway.tinker.shared import MemoryCalls
from tests.unit.test_tinker_api import BASE, FakeCatalog, FakeEngines, FakeTrainer, datum, sdk


class BusTrainer(FakeTrainer):
    """One fake trainer seen by several instances: every answer goes to every instance's
    futures (with the tenant, as the follower reads it from the answer's envelope)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[FuturesTable] = []

    def start(self, futures: FuturesTable) -> None:
        self.tables.append(futures)
        self.futures = futures

    def _answer(self, env) -> None:
        # FakeTrainer builds the answer and hands it to self.futures: capture it, then send it
        # to every instance still running.
        got: list = []

        class Capture:
            def answer_threadsafe(self, rid, answer, tenant=None):
                got.append(answer)
                return True

        self.futures = Capture()  # type: ignore[assignment]
        super()._answer(env)
        for table in list(self.tables):
            table.answer_threadsafe(env.payload.request_id, got[0], env.tenant)


@pytest.fixture
def two_gateways():
    catalog, shared, trainer = FakeCatalog(), MemoryCalls(), BusTrainer()
    servers = []
    for name in ("gw-a", "gw-b"):
        gw = Gateway(GatewayConfig(instance_id=name, port=0), catalog, FakeEngines())
        gw.tinker = TinkerApi(gw, trainer, [BASE], futures=FuturesTable(poll_s=0.5), shared=shared)
        servers.append(ThreadedServer(gw).start())
    balancer = RoundRobin([s.url for s in servers]).start()
    try:
        yield catalog, trainer, servers, balancer
    finally:
        balancer.stop()
        for s in servers:
            s.stop()


def _stop(server: ThreadedServer, trainer: BusTrainer) -> None:
    trainer.tables.remove(server.gateway.tinker.futures)
    server.stop()


def test_one_sdk_client_trains_through_two_gateways_and_survives_losing_one(two_gateways) -> None:
    catalog, trainer, (a, b), balancer = two_gateways
    service = sdk(balancer.url, catalog.add_key("acme"))
    tc = service.create_lora_training_client(BASE, rank=8, train_unembed=False).result()
    losses = []
    for _ in range(2):
        fb = tc.forward_backward([datum([1, 2, 3, 4])], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        losses.append(fb.result().metrics["loss:sum"])
    saved = tc.save_state("ckpt").result().path
    assert min(balancer.counts.values()) > 0  # both instances served calls
    # A call is taken by a, then a goes away before the SDK asks for its outcome: b answers it.
    trainer.delay_s = 1.0
    pending = tc.optim_step(types.AdamParams(learning_rate=1e-3))
    _stop(a, trainer)
    assert pending.result().metrics == {"grad_norm:mean": 1.5}
    # the model, its saved state and sampling live on without a
    fb = tc.forward_backward([datum([1, 2, 3, 4])], "cross_entropy").result()
    assert fb.metrics["loss:sum"] < losses[-1]
    with pytest.warns(FutureWarning, match="load_state"):  # deprecated in the SDK, served here
        tc.load_state(saved).result()
    assert trainer.seen[-1].payload.source_uri.endswith("/ckpt")
    path = tc.save_weights_for_sampler("s").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    assert sampler.sample(types.ModelInput.from_ints([1]), 1, types.SamplingParams()).result()
    ops = [e.payload.op for e in trainer.seen]
    assert ops.count("optim_step") == 3  # each call once


def test_a_call_resent_to_the_other_instance_answers_the_first_future(two_gateways) -> None:
    catalog, trainer, (a, b), _ = two_gateways
    acme = {"X-API-Key": f"tml-{catalog.add_key('acme')}"}
    tc = sdk(a.url, catalog.add_key("acme")).create_lora_training_client(BASE, rank=8).result()
    body = {"model_id": tc.model_id, "seq_id": 2, "adam_params": {}}
    once = acme | {"X-Idempotency-Key": "stainless-python-retry-7"}
    with httpx.Client(timeout=10) as raw:
        first = raw.post(f"{a.url}/api/v1/optim_step", json=body, headers=once).json()
        again = raw.post(f"{b.url}/api/v1/optim_step", json=body, headers=once).json()
        assert again["request_id"] == first["request_id"]
        got = raw.post(
            f"{b.url}/api/v1/retrieve_future",
            json={"request_id": first["request_id"]},
            headers=acme,
        ).json()
    assert got == {"metrics": {"grad_norm:mean": 1.5}}
    assert [e.payload.op for e in trainer.seen].count("optim_step") == 1
    # another tenant asking b for it: the same 404 as a missing future
    globex = {"X-API-Key": f"tml-{catalog.add_key('globex')}"}
    with httpx.Client(timeout=10) as raw:
        other = raw.post(
            f"{b.url}/api/v1/retrieve_future",
            json={"request_id": first["request_id"]},
            headers=globex,
        )
    assert other.status_code == 404


def test_a_restarted_instance_still_knows_the_models_made_before(two_gateways) -> None:
    catalog, trainer, (a, b), _ = two_gateways
    key = catalog.add_key("acme")
    tc = sdk(a.url, key).create_lora_training_client(BASE, rank=4, train_mlp=False).result()
    _stop(a, trainer)
    with httpx.Client(timeout=10) as raw:
        info = raw.post(
            f"{b.url}/api/v1/get_info",
            json={"model_id": tc.model_id},
            headers={"X-API-Key": f"tml-{key}"},
        )
    assert info.status_code == 200 and info.json()["lora_rank"] == 4

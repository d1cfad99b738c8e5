"""Issue 40: two gateway instances behind a round-robin balancer serve one official SDK client,
and one of them stopping mid-run loses no model, future or saved state. Each instance is a real
gateway (HTTP, Tinker API); what they share is :class:`MemoryCalls` here (the Cassandra rows of
catalog.tinker_calls in production: tests/integration), and the trainer is a fake that answers
every instance, as ``train.step.results`` reaches every follower."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from tinker import types
from tinker.proto.response_conv import deserialize_sample_response

from benchmarks._round_robin import RoundRobin
from gateway import GatewayConfig
from gateway.main import ThreadedServer
from gateway.service import Gateway
from gateway.tinker import answers
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
        engines = FakeEngines()
        engines.request_prefix = f"{name}."  # (request ids name their instance)
        gw = Gateway(GatewayConfig(instance_id=name, port=0), catalog, engines)
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


class StuckEngines(FakeEngines):
    """Engines that never answer (the instance dies before they would)."""

    async def submit(self, envs, timeout_s):
        self.seen.extend(envs)
        await asyncio.Event().wait()


def test_a_sample_whose_instance_died_is_run_again_by_another(two_gateways, monkeypatch) -> None:
    monkeypatch.setattr(answers, "LEASE_S", 1.0)  # (10 s in production)
    catalog, trainer, (a, b), _ = two_gateways
    key = catalog.add_key("acme")
    service_a = sdk(a.url, key)
    tc = service_a.create_lora_training_client(BASE, rank=8).result()
    path = tc.save_weights_for_sampler("s").result().path
    stuck = StuckEngines()
    stuck.request_prefix = a.gateway.engines.request_prefix
    a.gateway.engines = stuck
    acme = {"X-API-Key": f"tml-{key}"}
    body = {
        "sampling_session_id": None,
        "model_path": path,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
        "sampling_params": {"max_tokens": 4, "seed": 5, "stop": [9], "top_k": 4},
        "num_samples": 2,
        "prompt_logprobs": True,
        "topk_sample_logprobs": 2,
    }
    with httpx.Client(timeout=30) as raw:
        sent = raw.post(f"{a.url}/api/v1/asample", json=body, headers=acme)
        assert sent.status_code == 200, sent.text
        rid = sent.json()["request_id"]
        deadline = time.monotonic() + 10
        while len(stuck.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(stuck.seen) == 2  # a runs it, and never finishes
        _stop(a, trainer)
        for _ in range(20):  # as the SDK does: asks again on try_again (the lease runs 1 s)
            got = raw.post(
                f"{b.url}/api/v1/retrieve_future", json={"request_id": rid}, headers=acme
            )
            if got.headers["content-type"] != "application/json":
                break
            assert got.json()["type"] == "try_again", got.text
    assert got.status_code == 200 and got.headers["content-type"] == "application/x-protobuf"
    again = b.gateway.engines.seen
    assert [e.payload.prompt_token_ids for e in again] == [[1, 2, 3]] * 2
    assert [e.payload.seed for e in again] == [5, 6]  # the same sample, on b's engines
    # with the same options: stop ids, top_k, top-k logprobs; the prompt scored once
    assert [e.payload.sampling for e in again] == [e.payload.sampling for e in stuck.seen]
    options = again[0].payload.sampling
    assert options is not None and (options.stop_token_ids, options.top_k) == ([9], 4)
    assert [e.payload.sampling.prompt_logprobs for e in again] == [0, None]
    answer = deserialize_sample_response(got.content)
    assert answer.prompt_logprobs == [None, None, None]  # (the fake engines scored nothing)
    assert [s.topk_logprobs for s in answer.sequences] == [[None, None]] * 2
    assert all(e.payload.request_id.startswith(b.gateway.engines.request_prefix) for e in again)

"""The gateway's Tinker API (gateway/tinker) driven by the official ``tinker`` SDK 0.38.0 over
HTTP, with a fake catalog, fake engines and a fake trainer (no services): the mapping of each
call onto the step contract, bounds, tenancy, the futures protocol and the protobuf codec."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from catalog.apikeys import new_key
from catalog.models import ApiKey, TenantAccess
from gateway import GatewayConfig
from gateway.main import ThreadedServer
from gateway.service import Gateway
from gateway.tinker import wire
from gateway.tinker.futures import Done, Failed, FuturesTable
from gateway.tinker.service import TinkerApi
from schemas import make_event
from schemas.events import InferCompleted
from schemas.events.steps import MAX_STEP_TOKENS, TrainStepCompleted, TrainStepFailed

BASE = "tiny/llama-test"


class FakeCatalog:
    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}

    def add_key(self, tenant: str) -> str:
        key = new_key()
        self.keys[key.key_id] = ApiKey(
            key.key_id, tenant, "", key.kdf, key.salt, key.hash, datetime.now(UTC), "", None, None
        )
        return key.text

    def key(self, key_id):
        return self.keys.get(key_id)

    def tenant(self, tenant):
        return TenantAccess(tenant, None, "", None, None)

    def policy_exists(self, tenant, policy):
        return False

    def revision_of_digest(self, tenant, policy, digest):
        return None

    def models(self, tenant):
        return []


class FakeEngines:
    request_prefix = "gw-tk."
    healthy = True

    def __init__(self) -> None:
        self.seen: list = []

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def submit(self, envs, timeout_s):
        self.seen.extend(envs)
        return [
            make_event(
                InferCompleted(
                    request_id=env.payload.request_id,
                    revision=env.payload.revision,
                    adapter_digest="sha256:" + "1" * 64,
                    engine_id="e0",
                    text="",
                    finish_reason="length",
                    prompt_tokens=len(env.payload.prompt_token_ids),
                    completion_tokens=2,
                    latency_ms=1.0,
                    token_ids=[7, 8 + i],
                    logprobs=[-0.5, -0.25],
                ),
                tenant=env.tenant,
                policy=env.policy,
                producer="serving/e0",
                caused_by=env,
            )
            for i, env in enumerate(envs)
        ]


class FakeTrainer:
    """Answers each command from another thread after ``delay_s``, as the follower would: the
    loss falls by a tenth at every optim_step; ``fail`` answers train.step.failed instead."""

    healthy = True

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.seen: list = []
        self.loss = 2.0
        self.revision = 0
        self.fail: str | None = None
        self.silent = False
        self.futures: FuturesTable | None = None

    def start(self, futures: FuturesTable) -> None:
        self.futures = futures

    def close(self) -> None:
        pass

    async def publish(self, env) -> None:
        self.seen.append(env)
        if not self.silent:
            threading.Timer(self.delay_s, self._answer, args=(env,)).start()

    def _answer(self, env) -> None:
        cmd = env.payload
        assert self.futures is not None
        if self.fail:
            answer = TrainStepFailed(
                request_id=cmd.request_id, op=cmd.op, stage="validate", reason=self.fail
            )
        else:
            extra: dict = {}
            if cmd.op in ("forward", "forward_backward"):
                extra = {
                    "loss": self.loss,
                    "logprobs": [[-self.loss] * len(d.tokens) for d in cmd.datums],
                }
            elif cmd.op == "optim_step":
                self.loss *= 0.9
                extra = {"metrics": {"grad_norm": 1.5}}
            elif cmd.op == "save_for_sampler":
                self.revision += 1
                extra = {"revision": self.revision}
            elif cmd.op == "save_state":
                extra = {"state_uri": f"file:///store/{env.tenant}/{env.policy}/{cmd.name}"}
            answer = TrainStepCompleted(request_id=cmd.request_id, op=cmd.op, **extra)
        self.futures.answer_threadsafe(cmd.request_id, answer)


@pytest.fixture
def world():
    catalog, engines, trainer = FakeCatalog(), FakeEngines(), FakeTrainer()
    gw = Gateway(GatewayConfig(instance_id="gw-tk", port=0), catalog, engines)
    gw.tinker = TinkerApi(gw, trainer, [BASE], futures=FuturesTable(poll_s=0.5))
    server = ThreadedServer(gw).start()
    try:
        yield catalog, engines, trainer, server.url
    finally:
        server.stop()


def sdk(url: str, key: str) -> tinker.ServiceClient:
    return tinker.ServiceClient(base_url=url, api_key=f"tml-{key}")


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def test_sdk_trains_saves_and_samples_through_the_step_contract(world) -> None:
    catalog, engines, trainer, url = world
    key = catalog.add_key("acme")
    service = sdk(url, key)
    caps = tinker.RestClient(base_url=url, api_key=f"tml-{key}").get_server_capabilities().result()
    assert [m.model_name for m in caps.supported_models] == [BASE]

    tc = service.create_lora_training_client(BASE, rank=8, train_unembed=False, seed=3).result()
    create = trainer.seen[0]
    assert (create.tenant, create.payload.op, create.payload.base_model) == ("acme", "create", BASE)
    assert create.policy == tc.model_id.replace(":train:", "-")
    assert create.payload.lora.rank == 8 and create.payload.seed == 3
    assert create.payload.lora.target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    assert tc.get_info().model_data.model_name == BASE

    losses = []
    for _ in range(3):
        fb = tc.forward_backward([datum([1, 2, 3, 4]), datum([5, 6, 7])], "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=1e-3, beta2=0.99))
        out = fb.result()
        assert opt.result().metrics == {"grad_norm:mean": 1.5}  # Tinker's name:reduction
        losses.append(out.metrics["loss:sum"])
        got = [o["logprobs"].tolist() for o in out.loss_fn_outputs]
        assert got == [[pytest.approx(-losses[-1])] * 3, [pytest.approx(-losses[-1])] * 2]
    assert losses[0] > losses[1] > losses[2]
    fb_cmd = next(e.payload for e in trainer.seen if e.payload.op == "forward_backward")
    assert fb_cmd.datums[0].tokens == [1, 2, 3] and fb_cmd.datums[0].target_tokens == [2, 3, 4]
    assert fb_cmd.datums[0].weights == [1.0, 1.0, 1.0] and fb_cmd.loss_fn == "cross_entropy"
    adam = next(e.payload.adam for e in trainer.seen if e.payload.op == "optim_step")
    assert (adam.learning_rate, adam.beta2) == (1e-3, 0.99)
    assert {e.policy for e in trainer.seen} == {create.policy}  # one key: one policy's order

    fwd = tc.forward([datum([1, 2, 3])], "cross_entropy").result()
    assert trainer.seen[-1].payload.op == "forward" and len(fwd.loss_fn_outputs) == 1

    path = tc.save_weights_for_sampler("first").result().path
    assert path == f"tinker://{create.policy}/sampler_weights/first@1"
    sampler = service.create_sampling_client(model_path=path).result()
    got = sampler.sample(
        types.ModelInput.from_ints([1, 2, 3]),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=5, temperature=0.7, seed=4),
    ).result()
    assert [s.tokens for s in got.sequences] == [[7, 8], [7, 9]]
    assert [s.stop_reason for s in got.sequences] == ["length", "length"]
    assert got.sequences[0].logprobs == pytest.approx([-0.5, -0.25])
    asked = [e.payload for e in engines.seen]
    assert [p.prompt_token_ids for p in asked] == [[1, 2, 3]] * 2
    assert {(p.revision, p.logprobs, p.max_tokens, p.temperature) for p in asked} == {
        (1, True, 5, 0.7)
    }
    assert [p.seed for p in asked] == [4, 5]
    assert {e.policy for e in engines.seen} == {create.policy}

    # save_weights_and_get_sampling_client: a session pinned to the new revision
    sampler2 = tc.save_weights_and_get_sampling_client().result()
    assert sampler2.sample(types.ModelInput.from_ints([1]), 1, types.SamplingParams()).result()
    assert engines.seen[-1].payload.revision == 2

    saved = tc.save_state("ckpt").result().path
    assert saved == f"tinker://{create.policy}/weights/ckpt"
    with pytest.warns(FutureWarning, match="load_state"):  # deprecated in the SDK, served here
        tc.load_state(saved).result()
    load = trainer.seen[-1]
    assert load.payload.source_uri == f"file:///store/acme/{load.policy}/ckpt"
    service.close("success").result()


def test_unsupported_loss_and_lora_shapes_are_clear_400s(world) -> None:
    catalog, _, trainer, url = world
    service = sdk(url, catalog.add_key("acme"))
    # Tinker's defaults (train_unembed=True): accepted, attention and MLP trained
    service.create_lora_training_client(BASE, rank=8).result()
    assert trainer.seen[-1].payload.lora.target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    with pytest.raises(tinker.BadRequestError, match="rank"):
        service.create_lora_training_client(BASE, rank=65, train_unembed=False).result()
    with pytest.raises(tinker.BadRequestError, match="not served here"):
        service.create_lora_training_client("Qwen/Qwen3-8B", rank=8, train_unembed=False).result()
    tc = service.create_lora_training_client(
        BASE, rank=4, train_unembed=False, train_mlp=False
    ).result()
    assert trainer.seen[-1].payload.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    with pytest.raises(tinker.BadRequestError, match="'dpo'.*cross_entropy, importance_sampling"):
        tc.forward_backward([datum([1, 2, 3])], "dpo").result()
    with pytest.raises(tinker.BadRequestError, match="'stable_reinforce'.*objective is not publ"):
        tc.forward_backward([datum([1, 2, 3])], "stable_reinforce").result()
    with pytest.raises(tinker.BadRequestError, match="'custom'.*pass the loss function itself"):
        tc.forward_backward([datum([1, 2, 3])], "custom", {"loss_id": "x"}).result()
    # ppo needs the sampler's logprobs and advantages per position: the contract says which
    with pytest.raises(tinker.BadRequestError, match="lacks logprobs, advantages"):
        tc.forward_backward([datum([1, 2, 3])], "ppo").result()
    with httpx.Client(base_url=url) as raw:
        got = raw.post("/api/v1/copy_weights", json={}, headers=_auth(catalog, "acme"))
    assert got.status_code == 400
    assert got.json()["error"]["message"].startswith("copy_weights is not supported")
    # a trainer's refusal is the future's error, a user error
    trainer.fail = "policy acme/x: optimizer state lost"
    with pytest.raises(tinker.RequestFailedError, match="optimizer state lost") as e:
        tc.optim_step(types.AdamParams()).result()
    assert e.value.category == types.RequestErrorCategory.User


def _auth(catalog: FakeCatalog, tenant: str) -> dict[str, str]:
    return {"X-API-Key": f"tml-{catalog.add_key(tenant)}"}


def _fwdbwd_body(model_id: str, datums: list[types.Datum]) -> bytes:
    from tinker.proto.request_conv import forward_backward_request_to_proto

    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=1,
    )
    return forward_backward_request_to_proto(req).SerializeToString()


PROTO = {"Content-Type": "application/x-protobuf"}


def test_another_tenants_model_and_futures_are_404_like_missing_ones(world) -> None:
    catalog, _, trainer, url = world
    tc = (
        sdk(url, catalog.add_key("acme"))
        .create_lora_training_client(BASE, rank=8, train_unembed=False)
        .result()
    )
    future = tc.forward_backward([datum([1, 2, 3])], "cross_entropy")
    future.result()
    acme, globex = _auth(catalog, "acme"), _auth(catalog, "globex")
    rid = trainer.seen[-1].payload.request_id
    missing = tc.model_id.replace(":train:", ":train:9")
    with httpx.Client(base_url=url, timeout=10) as raw:
        for model_id in (tc.model_id, missing, "nonsense"):
            got = raw.post("/api/v1/get_info", json={"model_id": model_id}, headers=globex)
            assert got.status_code == 404, got.text
            assert "does not exist or you do not have access" in got.json()["error"]["message"]
            body = _fwdbwd_body(model_id, [datum([1, 2])])
            sent = raw.post("/api/v1/forward_backward", content=body, headers=globex | PROTO)
            assert sent.status_code == 404
        other = raw.post("/api/v1/retrieve_future", json={"request_id": rid}, headers=globex)
        mine = raw.post("/api/v1/retrieve_future", json={"request_id": rid}, headers=acme)
        assert other.status_code == 404 and mine.status_code == 200
        assert mine.headers["content-type"] == "application/x-protobuf"
        none = raw.post("/api/v1/retrieve_future", json={"request_id": "x"}, headers=acme)
        assert none.status_code == 404
        # a sampler path of acme's policy, asked by globex: the same 404
        path = f"tinker://{tc.model_id.replace(':train:', '-')}/sampler_weights/a@1"
        body = {"session_id": "tk00000000", "model_path": path}
        got = raw.post("/api/v1/create_sampling_session", json=body, headers=globex)
        assert got.status_code == 404
        assert raw.post("/api/v1/get_info", json={"model_id": tc.model_id}).status_code == 401
    assert len([e for e in trainer.seen if e.tenant == "globex"]) == 0


def test_bounds_of_one_call(world) -> None:
    catalog, _, trainer, url = world
    tc = (
        sdk(url, catalog.add_key("acme"))
        .create_lora_training_client(BASE, rank=8, train_unembed=False)
        .result()
    )
    acme = _auth(catalog, "acme")
    long = [datum(list(range(8_000))) for _ in range(3)]  # 23,997 positions in one call
    with httpx.Client(base_url=url, timeout=10) as raw:
        got = raw.post(
            "/api/v1/forward_backward",
            content=_fwdbwd_body(tc.model_id, long),
            headers=acme | PROTO,
        )
        assert got.status_code == 400
        assert f"one call carries at most {MAX_STEP_TOKENS}" in got.json()["error"]["message"]
        too_long = [datum(list(range(9_000)))]
        got = raw.post(
            "/api/v1/forward_backward",
            content=_fwdbwd_body(tc.model_id, too_long),
            headers=acme | PROTO,
        )
        assert got.status_code == 400 and "tokens" in got.json()["error"]["message"]
        got = raw.post("/api/v1/forward_backward", content=b"\xff\xff", headers=acme | PROTO)
        assert got.status_code == 400 and "protobuf" in got.json()["error"]["message"]
    # the SDK splits the same batch into calls within the bounds (its client config says how)
    n = len(trainer.seen)
    out = tc.forward_backward(long, "cross_entropy").result()
    calls = [e.payload for e in trainer.seen[n:]]
    assert len(calls) >= 2 and len(out.loss_fn_outputs) == 3
    assert all(sum(len(d.tokens) for d in c.datums) <= MAX_STEP_TOKENS for c in calls)


def test_a_pending_future_answers_try_again_then_its_result(world) -> None:
    catalog, _, trainer, url = world
    tc = (
        sdk(url, catalog.add_key("acme"))
        .create_lora_training_client(BASE, rank=8, train_unembed=False)
        .result()
    )
    trainer.delay_s = 1.5  # longer than the poll (0.5 s): the SDK is told to try again
    t0 = time.monotonic()
    assert tc.optim_step(types.AdamParams()).result().metrics is not None
    assert time.monotonic() - t0 >= 1.4
    trainer.silent = True
    acme = _auth(catalog, "acme")
    with httpx.Client(base_url=url, timeout=10) as raw:
        got = raw.post(
            "/api/v1/optim_step", json={"model_id": tc.model_id, "adam_params": {}}, headers=acme
        ).json()
        polled = raw.post(
            "/api/v1/retrieve_future", json={"request_id": got["request_id"]}, headers=acme
        )
    assert polled.json() == {
        "type": "try_again",
        "request_id": got["request_id"],
        "queue_state": "active",
    }


def test_futures_table_times_out_and_forgets() -> None:
    asyncio.run(_times_out_and_forgets())


async def _times_out_and_forgets() -> None:
    now = [0.0]
    table = FuturesTable(poll_s=0.01, answer_timeout_s=10, keep_s=5, clock=lambda: now[0])
    entry = table.add("r1", "acme", "optim_step")
    assert await table.wait(entry) is None
    now[0] = 11
    outcome = await table.wait(entry)
    assert isinstance(outcome, Failed) and "within 10 s" in outcome.message
    assert table.get("r1", "globex") is None and table.get("r1", "acme") is entry
    assert not table.settle("r1", Done({}))  # settled once only
    now[0] = 20
    table.add("r2", "acme", "create")  # trims what was settled more than keep_s ago
    assert table.get("r1", "acme") is None and len(table) == 1


def test_wire_field_numbers_match_the_sdk_descriptor() -> None:
    from tinker.proto import tinker_public_pb2 as pb

    def numbers(message: str) -> dict[str, int]:
        return {f.name: f.number for f in pb.DESCRIPTOR.message_types_by_name[message].fields}

    assert numbers("ForwardBackwardRequest") == {
        "model_id": 1,
        "seq_id": 2,
        "data": 3,
        "loss_fn": 4,
        "loss_fn_config": 5,
        "forward_only": 6,
        "loss_fn_config_v2": 7,
    }
    assert numbers("Datum")["model_input"] == 1 and numbers("Datum")["loss_fn_inputs"] == 2
    assert numbers("Tensor") == {"dense": 1, "sparse_csr": 2, "dtype": 3, "shape": 4}
    assert numbers("ForwardBackwardOutput") == {
        "loss_fn_output_type": 1,
        "loss_fn_outputs": 2,
        "metrics": 3,
    }
    assert numbers("ArrayRecord") == {"type_tag": 1, "fields": 2, "num_datums": 3}
    assert numbers("BatchedTensor") == {"data": 1, "offsets": 2, "dtype": 3, "trailing_shape": 4}
    assert numbers("SampledSequence")["tokens"] == 2 and numbers("SampledSequence")["logprobs"] == 3
    assert pb.DTYPE_FLOAT32 == wire.DTYPE_FLOAT32 and pb.STOP_REASON_LENGTH == 1


def test_wire_reads_loss_inputs_and_refuses_images() -> None:
    d = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={
            "target_tokens": [2, 3],
            "logprobs": [-0.1, -0.2],
            "advantages": np.array([1.0, -1.0], dtype=np.float32),
        },
    )
    got = wire.decode_forward_backward(_fwdbwd_body("tk00000000:train:0", [d]))
    assert got.data[0].tokens == [1, 2] and got.data[0].inputs["target_tokens"].tolist() == [2, 3]
    assert got.data[0].inputs["advantages"].tolist() == [1.0, -1.0]
    image = types.Datum(
        model_input=types.ModelInput(
            chunks=[types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)]
        ),
        loss_fn_inputs={"target_tokens": [1, 2, 3, 4]},
    )
    with pytest.raises(wire.WireError, match="image chunk"):
        wire.decode_forward_backward(_fwdbwd_body("tk00000000:train:0", [image]))


def test_sampling_refusals_name_the_parameter(world) -> None:
    catalog, engines, _, url = world
    service = sdk(url, catalog.add_key("acme"))
    tc = service.create_lora_training_client(BASE, rank=8, train_unembed=False).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints([1, 2])
    refused = {  # (what MinT does run: tests/unit/test_tinker_sampling.py)
        "sampling_params.top_k -2": dict(sampling_params=types.SamplingParams(top_k=-2)),
        "over this gateway's limit": dict(sampling_params=types.SamplingParams(max_tokens=5000)),
        "topk_prompt_logprobs 21 is over": dict(
            sampling_params=types.SamplingParams(), topk_prompt_logprobs=21
        ),
        "prompt_alt_tokens_k: not supported.*draws no tokens": dict(
            sampling_params=types.SamplingParams(), prompt_alt_tokens_k=2
        ),
    }
    for message, kwargs in refused.items():
        with pytest.raises(tinker.BadRequestError, match=message):
            sampler.sample(prompt, 1, **kwargs).result()
    assert engines.seen == []
    with httpx.Client(base_url=url) as raw:
        got = raw.post("/api/v1/create_custom_loss", json={}, headers=_auth(catalog, "acme"))
        bare = {"session_id": "tk00000000", "base_model": BASE}
        base = raw.post(
            "/api/v1/create_sampling_session", json=bare, headers=_auth(catalog, "acme")
        )
    assert got.status_code == 400 and "create_custom_loss is not supported" in got.text
    assert base.status_code == 400 and "bare base model is not supported" in base.text

"""Issue 40 at the gateway's Tinker API: a call the SDK sends again is applied once, loss
inputs are finite or refused, and ``num_samples`` keeps the gateway's per-request limits. The
SDK, the gateway and the HTTP path are real; catalog, engines and trainer are the fakes of
test_tinker_api."""

from __future__ import annotations

import math
import re
import time

import httpx
import pytest
import tinker
from tinker import types

from gateway.errors import Unavailable
from tests.unit import test_tinker_api as api_tests
from tests.unit.test_tinker_api import BASE, _auth, datum, sdk

world = api_tests.world  # the fixture: fake catalog, engines and trainer behind a real gateway


def _model(catalog, url: str, tenant: str = "acme"):
    service = sdk(url, catalog.add_key(tenant))
    return service, service.create_lora_training_client(BASE, rank=8, train_unembed=False).result()


def _ops(trainer, op: str) -> list:
    return [e for e in trainer.seen if e.payload.op == op]


def test_a_resent_call_answers_the_first_future_and_is_published_once(world) -> None:
    catalog, _, trainer, url = world
    _, tc = _model(catalog, url)
    acme = _auth(catalog, "acme")
    body = {"model_id": tc.model_id, "seq_id": 7, "adam_params": {"learning_rate": 1e-3}}
    once = acme | {"X-Idempotency-Key": "stainless-python-retry-1"}
    with httpx.Client(base_url=url, timeout=10) as raw:
        first = raw.post("/api/v1/optim_step", json=body, headers=once).json()
        again = raw.post("/api/v1/optim_step", json=body, headers=once).json()
        assert again["request_id"] == first["request_id"]
        assert len(_ops(trainer, "optim_step")) == 1
        # another call (its own key) is another step, with another event id
        other = raw.post(
            "/api/v1/optim_step",
            json=body | {"seq_id": 8},
            headers=acme | {"X-Idempotency-Key": "stainless-python-retry-2"},
        ).json()
        assert other["request_id"] != first["request_id"]
        steps = _ops(trainer, "optim_step")
        assert len(steps) == 2 and steps[0].event_id != steps[1].event_id
        # without a key (not the SDK): nothing to recognise a copy by, so each is a call
        raw.post("/api/v1/optim_step", json=body, headers=acme)
        raw.post("/api/v1/optim_step", json=body, headers=acme)
    assert len(_ops(trainer, "optim_step")) == 4


def test_a_call_that_failed_to_queue_is_sent_again_under_the_same_event_id(world) -> None:
    catalog, _, trainer, url = world
    _, tc = _model(catalog, url)
    publish = trainer.publish
    outage = {"left": 1}

    async def flaky(env) -> None:  # the first send is refused (the broker's ack timed out)
        trainer.seen.append(env)
        if outage["left"]:
            outage["left"] -= 1
            raise Unavailable("the call could not be queued for the trainer; retry shortly")
        trainer.seen.pop()
        await publish(env)

    trainer.publish = flaky
    acme = _auth(catalog, "acme") | {"X-Idempotency-Key": "k-1"}
    body = {"model_id": tc.model_id, "seq_id": 3, "adam_params": {}}
    with httpx.Client(base_url=url, timeout=10) as raw:
        assert raw.post("/api/v1/optim_step", json=body, headers=acme).status_code == 503
        ok = raw.post("/api/v1/optim_step", json=body, headers=acme)
        assert ok.status_code == 200
        done = raw.post(
            "/api/v1/retrieve_future", json={"request_id": ok.json()["request_id"]}, headers=acme
        )
    assert "metrics" in done.json()
    sent = _ops(trainer, "optim_step")
    # the record may have reached the broker the first time: the trainer sees one event id
    assert len(sent) == 2 and sent[0].event_id == sent[1].event_id


def test_default_checkpoint_names_are_the_same_for_each_copy_of_a_call(world) -> None:
    catalog, _, trainer, url = world
    _, tc = _model(catalog, url)
    acme = _auth(catalog, "acme")
    with httpx.Client(base_url=url, timeout=10) as raw:
        for key in ("save-1", "save-1", "save-2"):
            raw.post(
                "/api/v1/save_weights",
                json={"model_id": tc.model_id, "seq_id": 4},
                headers=acme | {"X-Idempotency-Key": key},
            )
    names = [e.payload.name for e in _ops(trainer, "save_state")]
    assert len(names) == 2 and names[0] != names[1]


@pytest.mark.parametrize(
    ("field", "values", "shown"),
    [
        ("weights", [1.0, math.nan], "weights[1] is nan"),
        ("weights", [math.inf, 1.0], "weights[0] is inf"),
    ],
)
def test_non_finite_loss_inputs_are_400s_naming_the_datum_and_field(
    world, field, values, shown
) -> None:
    catalog, _, trainer, url = world
    _, tc = _model(catalog, url)
    bad = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"target_tokens": [2, 3], field: values},
    )
    with pytest.raises(tinker.BadRequestError, match=re.escape(f"data[1].loss_fn_inputs.{shown}")):
        tc.forward_backward([datum([1, 2, 3]), bad], "cross_entropy").result()
    assert not _ops(trainer, "forward_backward")


def test_non_finite_advantages_and_optimizer_values_are_400s(world) -> None:
    catalog, _, trainer, url = world
    _, tc = _model(catalog, url)
    ppo = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={
            "target_tokens": [2, 3],
            "logprobs": [-1.0, -2.0],
            "advantages": [0.5, -math.inf],
        },
    )
    with pytest.raises(tinker.BadRequestError, match=r"advantages\[1\] is -inf"):
        tc.forward_backward([ppo], "ppo").result()
    with pytest.raises(tinker.BadRequestError, match="learning_rate"):
        tc.optim_step(types.AdamParams(learning_rate=math.nan)).result()
    acme = _auth(catalog, "acme")
    with httpx.Client(base_url=url, timeout=10) as raw:
        got = raw.post(
            "/api/v1/optim_step",
            content=b'{"model_id": "%s", "adam_params": {"grad_clip_norm": Infinity}}'
            % tc.model_id.encode(),
            headers=acme | {"Content-Type": "application/json"},
        )
    assert got.status_code == 400 and "grad_clip_norm" in got.text
    assert not trainer.seen[1:]  # only the create went out


def test_num_samples_keeps_the_gateways_limit_and_engine_requests_expire(world) -> None:
    catalog, engines, _, url = world
    service, tc = _model(catalog, url)
    path = tc.save_weights_for_sampler("s").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints([1, 2, 3])
    with pytest.raises(tinker.BadRequestError, match="num_samples 9 is over .* limit of 8"):
        sampler.sample(prompt, num_samples=9, sampling_params=types.SamplingParams()).result()
    assert not engines.seen
    sampler.sample(prompt, num_samples=8, sampling_params=types.SamplingParams()).result()
    assert len(engines.seen) == 8
    assert all(e.payload.expires_at is not None for e in engines.seen)


def test_a_resent_sample_answers_the_first_future_and_runs_once(world) -> None:
    catalog, engines, _, url = world
    _, tc = _model(catalog, url)
    path = tc.save_weights_for_sampler("s").result().path
    acme = _auth(catalog, "acme")
    body = {
        "model_path": path,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
        "sampling_params": {"max_tokens": 4},
        "num_samples": 2,
        "seq_id": 5,
    }
    with httpx.Client(base_url=url, timeout=10) as raw:
        once = acme | {"X-Idempotency-Key": "stainless-python-retry-s"}
        first = raw.post("/api/v1/asample", json=body, headers=once).json()
        again = raw.post("/api/v1/asample", json=body, headers=once).json()
        assert again == first
        other = raw.post(
            "/api/v1/asample", json=body, headers=acme | {"X-Idempotency-Key": "another"}
        ).json()
    assert other["request_id"] != first["request_id"]
    deadline = time.monotonic() + 10  # (samples run in tasks after the calls answer)
    while len(engines.seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert len(engines.seen) == 4  # two calls of two samples: the copy ran nothing

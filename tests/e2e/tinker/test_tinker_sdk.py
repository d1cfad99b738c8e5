"""The official ``tinker`` SDK 0.38.0, unchanged, against a MinT gateway (TINKER_BASE_URL) with a
MinT key (TINKER_API_KEY=tml-<key>): supervised LoRA training through the real trainer over Kafka
and Cassandra (ten forward_backward + optim_step, the loss falls), another tenant's key gets 404
on the model, and the saved weights sample on a real vLLM engine (with stop token ids, top_k,
top-k logprobs and prompt logprobs equal to the trainer's forward logprobs)."""

from __future__ import annotations

import warnings
from pathlib import Path

import httpx
import pytest
import tinker
from tinker import types

# Two short sequences the tiny Llama learns by heart in ten steps (token ids of its vocabulary).
SEQUENCES = [[5, 9, 13, 21, 34, 55], [7, 11, 19, 3, 8]]
WAIT_S = 900  # the trainer loads the base model on its first call, vLLM starts; CPUs are shared


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


@pytest.fixture(scope="module")
def trained(tk_gateway, tk_model, tenant_key):
    """A tenant's LoRA trained ten steps through the SDK, configured only by the environment:
    (service, training client, losses, the tenant's key)."""
    _, key = tenant_key()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TINKER_BASE_URL", tk_gateway)
        env.setenv("TINKER_API_KEY", key)
        service = tinker.ServiceClient()
        caps = tinker.RestClient().get_server_capabilities().result(timeout=60)
        assert [m.model_name for m in caps.supported_models] == [str(tk_model)]
        tc = service.create_lora_training_client(
            str(tk_model), rank=8, seed=0, train_mlp=False, train_unembed=False
        ).result(timeout=WAIT_S)
        batch = [datum(s) for s in SEQUENCES]
        losses = []
        for _ in range(10):
            fb = tc.forward_backward(batch, "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=1e-2))
            out = fb.result(timeout=WAIT_S)
            opt.result(timeout=WAIT_S)
            assert [len(o["logprobs"].tolist()) for o in out.loss_fn_outputs] == [5, 4]
            losses.append(out.metrics["loss:sum"])
        yield service, tc, losses, key
        service.close("success").result(timeout=60)


def test_sdk_trains_a_lora_and_the_loss_falls(trained, tk_gateway, tenant_key) -> None:
    _, tc, losses, _ = trained
    print("losses:", [round(x, 4) for x in losses])
    assert losses[-1] < losses[0] * 0.9 and losses[-1] == min(losses), losses

    # Another tenant's key: the model is a 404, the same as one that does not exist.
    _, other = tenant_key()
    missing = tc.model_id.replace(":train:", ":train:7")
    with httpx.Client(base_url=tk_gateway, headers={"X-API-Key": other}, timeout=30) as raw:
        for model_id in (tc.model_id, missing):
            got = raw.post("/api/v1/get_info", json={"model_id": model_id})
            assert got.status_code == 404, got.text
            step = raw.post("/api/v1/optim_step", json={"model_id": model_id, "adam_params": {}})
            assert step.status_code == 404, step.text
    policy = tc.model_id.replace(":train:", "-")
    other_service = tinker.ServiceClient(base_url=tk_gateway, api_key=other)
    with pytest.raises(tinker.NotFoundError):
        other_service.create_sampling_client(
            model_path=f"tinker://{policy}/sampler_weights/x@1"
        ).result(timeout=60)
    other_service.close("success").result(timeout=60)  # its heartbeat stops with it


def test_saved_weights_sample_on_the_engine(trained, tk_gateway, tk_engine) -> None:
    service, tc, _, key = trained
    path = tc.save_weights_for_sampler("e2e").result(timeout=WAIT_S).path
    assert path.startswith("tinker://") and path.endswith("/sampler_weights/e2e@1")
    sampler = service.create_sampling_client(model_path=path).result(timeout=60)
    got = sampler.sample(
        types.ModelInput.from_ints(SEQUENCES[0][:3]),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0, seed=1),
    ).result(timeout=WAIT_S)  # the engine's first request waits for vLLM to start
    assert len(got.sequences) == 2
    for seq in got.sequences:
        assert 1 <= len(seq.tokens) <= 6 and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)

    # An ordinary policy of the tenant: its revision is in the catalog and served through the
    # OpenAI surface, seen by the tenant's remote client with the same key (promotion by alias
    # needs the controller: tests/integration/lifecycle/test_remote_client.py).
    from mint.sdk import MintClient

    remote = MintClient.remote(tk_gateway, key.removeprefix("tml-"))
    policy = tc.model_id.replace(":train:", "-")
    assert [r.revision for r in remote.revisions(policy)] == [1]
    answer = remote.infer(policy, "the cat", revision=1, max_tokens=4)
    assert answer.revision == 1 and answer.completion_tokens >= 1


def test_the_readme_example_runs_as_written(tk_gateway, tk_engine, tenant_key) -> None:
    """README "Train your own task": its Python block, verbatim, with a key and the SDK alone."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme.split("### Train your own task", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    _, key = tenant_key()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TINKER_BASE_URL", tk_gateway)
        env.setenv("TINKER_API_KEY", key)
        scope: dict = {"__name__": "README"}  # the warning filters below match this name
        with warnings.catch_warnings():  # the example uses no call the SDK deprecates
            warnings.filterwarnings("error", category=FutureWarning, module="README")
            warnings.filterwarnings("error", message=".*deprecated", module="README")
            exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's example
    scope["service"].close("success").result(timeout=60)
    assert len(scope["out"].sequences) == 4
    assert all(len(s.tokens) == len(s.logprobs) >= 1 for s in scope["out"].sequences)


def test_sampling_options_answer_as_tinker_does(trained, tk_engine) -> None:
    """Stop token ids, top_k, prompt logprobs and top-k logprobs on the real engine: the prompt's
    logprobs are the trainer's ``forward`` logprobs of the same weights."""
    service, tc, _, _ = trained
    path = tc.save_weights_for_sampler("options").result(timeout=WAIT_S).path
    sampler = service.create_sampling_client(model_path=path).result(timeout=60)
    prompt = SEQUENCES[0]
    greedy = sampler.sample(
        types.ModelInput.from_ints(prompt[:3]),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=8, temperature=0.0),
    ).result(timeout=WAIT_S)
    tokens = greedy.sequences[0].tokens
    assert 1 <= len(tokens) <= 8, tokens
    stop = tokens[min(2, len(tokens) - 1)]
    until = tokens[: tokens.index(stop) + 1]  # the stop token ends the sample, and is in it

    # top_k=1 at temperature 1 samples the greedy tokens; the prompt scored with k alternatives
    k = 3
    got = sampler.sample(
        types.ModelInput.from_ints(prompt[:3]),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, top_k=1, stop=[stop]),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
        topk_sample_logprobs=2,
    ).result(timeout=WAIT_S)
    for seq in got.sequences:
        assert seq.tokens == until and seq.stop_reason == "stop", (seq.tokens, tokens, stop)
        assert len(seq.topk_logprobs) == len(seq.tokens)
        for token, logprob, top in zip(seq.tokens, seq.logprobs, seq.topk_logprobs, strict=True):
            assert len(top) == 2 and top[0][0] == token  # top_k=1: the likeliest token
            assert top[0][1] == pytest.approx(logprob, abs=1e-4) and top[1][1] <= top[0][1]
    assert got.prompt_logprobs is not None and len(got.prompt_logprobs) == 3

    scored = sampler.sample(
        types.ModelInput.from_ints(prompt),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
    ).result(timeout=WAIT_S)
    lps, rows = scored.prompt_logprobs, scored.topk_prompt_logprobs
    assert len(lps) == len(rows) == len(prompt) and lps[0] is None and rows[0] is None
    assert all(lp <= 0 for lp in lps[1:])
    forward = tc.forward([datum(prompt)], "cross_entropy").result(timeout=WAIT_S)
    expected = forward.loss_fn_outputs[0]["logprobs"].tolist()
    print("prompt logprobs:", lps[1:], "forward:", expected)
    assert lps[1:] == pytest.approx(expected, abs=2e-2)
    for token, lp, row in zip(prompt[1:], lps[1:], rows[1:], strict=True):
        assert len(row) == k and [v for _, v in row] == sorted((v for _, v in row), reverse=True)
        assert row[0][1] >= lp - 1e-4
        assert dict(row).get(token, lp) == pytest.approx(lp, abs=1e-4)

    # only the last n positions, as prompt_logprobs_last_n asks (the SDK checks it too)
    last = sampler.sample(
        types.ModelInput.from_ints(prompt),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        prompt_logprobs_last_n=2,
    ).result(timeout=WAIT_S)
    assert last.prompt_logprobs[:-2] == [None] * (len(prompt) - 2)
    assert last.prompt_logprobs[-2:] == pytest.approx(lps[-2:], abs=1e-4)
    assert last.topk_prompt_logprobs is None

    # a k past vLLM's max_logprobs: the gateway's 400 names it
    with pytest.raises(tinker.BadRequestError, match="topk_prompt_logprobs 21"):
        sampler.sample(
            types.ModelInput.from_ints(prompt), 1, types.SamplingParams(), topk_prompt_logprobs=21
        ).result(timeout=60)

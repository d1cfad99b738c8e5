"""The Tinker API's losses beyond cross_entropy, importance_sampling and ppo, through the
official SDK against the gateway with a fake trainer (tests/unit/test_tinker_api.py's world):
cispo, dro and gspo become commands with their configs and inputs, bad config values and the
losses MinT cannot run are 400s naming them, and forward_backward_custom arrives as the SDK
sends it (a forward, then a cross_entropy forward_backward with weights -dC/dlogprobs)."""

from __future__ import annotations

import httpx
import pytest
import tinker
import torch
from tinker import types

from tests.unit.test_tinker_api import BASE, datum, sdk, world  # noqa: F401 - world: a fixture


def rl_datum(tokens: list[int], **more: list[float]) -> types.Datum:
    n = len(tokens) - 1
    inputs = {"target_tokens": tokens[1:], "logprobs": [-1.0] * n, "advantages": [0.5] * n}
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs | more
    )


def test_the_new_losses_and_forward_backward_custom_reach_the_trainer(world) -> None:  # noqa: F811
    """cispo, dro, gspo with their configs and inputs as commands; forward_backward_custom as
    the SDK runs it: a forward (cross_entropy, the datums' weights), then a cross_entropy
    forward_backward whose weights are -dC/dlogprobs (negative and arbitrary here)."""
    catalog, _, trainer, url = world
    tc = sdk(url, catalog.add_key("acme")).create_lora_training_client(BASE, rank=4).result()
    for loss_fn, config in [("cispo", {"clip_high_threshold": 1.5}), ("dro", {"beta": 0.1})]:
        tc.forward_backward([rl_datum([1, 2, 3])], loss_fn, config).result()
        cmd = trainer.seen[-1].payload
        assert (cmd.loss_fn, cmd.loss_fn_config) == (loss_fn, config)
    tc.forward_backward([rl_datum([1, 2, 3], sequence_ratio_mask=[0.0, 1.0])], "gspo").result()
    cmd = trainer.seen[-1].payload
    assert cmd.loss_fn == "gspo" and cmd.datums[0].sequence_ratio_mask == [0.0, 1.0]

    w = [[3.0, -2.5, 0.0], [-1e-3, 7.0]]

    def custom(data, logprobs):
        loss = sum((lp * torch.tensor(wi)).sum() for lp, wi in zip(logprobs, w, strict=True))
        return loss, {"custom_metric": 1.0}

    before = len(trainer.seen)
    out = tc.forward_backward_custom([datum([1, 2, 3, 4]), datum([5, 6, 7])], custom).result()
    fwd, bwd = (env.payload for env in trainer.seen[before:])
    assert fwd.op == "forward" and fwd.loss_fn == "cross_entropy"
    assert [d.weights for d in fwd.datums] == [[1.0] * 3, [1.0] * 2]  # the datums' own
    assert bwd.op == "forward_backward" and bwd.loss_fn == "cross_entropy"
    for d, wi in zip(bwd.datums, w, strict=True):  # float32 on the wire
        assert d.weights == pytest.approx([-v for v in wi], rel=1e-6)
    assert out.metrics["custom_metric"] == 1.0
    assert out.metrics["loss:sum"] == pytest.approx(-trainer.loss * sum(map(sum, w)), rel=1e-5)
    # the next call goes on in order after the two reserved seq ids
    tc.forward_backward([datum([1, 2, 3])], "cross_entropy").result()
    assert trainer.seen[-1].payload.op == "forward_backward"


def test_bad_loss_configs_and_inputs_are_400s_naming_the_field(world) -> None:  # noqa: F811
    catalog, _, _, url = world
    tc = sdk(url, catalog.add_key("acme")).create_lora_training_client(BASE, rank=4).result()
    rl = rl_datum([1, 2, 3])
    with pytest.raises(tinker.BadRequestError, match="loss_fn_config.beta is -1.0"):
        tc.forward_backward([rl], "dro", {"beta": -1.0}).result()
    with pytest.raises(tinker.BadRequestError, match="loss_fn_config.clip_high_threshold"):
        tc.forward_backward([rl], "cispo", {"clip_high_threshold": 0.5}).result()
    with pytest.raises(tinker.BadRequestError, match="does not take; it takes \\['beta'\\]"):
        tc.forward_backward([rl], "dro", {"clip_low_threshold": 0.5}).result()
    with pytest.raises(tinker.BadRequestError, match="sequence_ratio_mask.*finite"):
        bad = {**rl.loss_fn_inputs, "sequence_ratio_mask": [1.0, float("nan")]}
        nan = types.Datum(model_input=rl.model_input, loss_fn_inputs=bad)
        tc.forward_backward([nan], "gspo").result()


def test_seq_ids_that_skip_numbers_are_accepted(world) -> None:  # noqa: F811
    """forward_backward_custom reserves ids for its forward and backward chunks, and parallel
    chunks arrive out of order: any seq id, in any order, is a call of its own."""
    from tinker.proto.request_conv import forward_backward_request_to_proto

    from tests.unit.test_tinker_api import PROTO, _auth

    catalog, _, trainer, url = world
    auth = _auth(catalog, "acme")
    tc = sdk(url, auth["X-API-Key"].removeprefix("tml-")).create_lora_training_client(BASE, rank=4)
    model_id = tc.result().model_id
    weights = [-2.0, 0.5]
    before = len(trainer.seen)
    with httpx.Client(base_url=url, timeout=30) as raw:
        for seq_id in (7, 3, 40):
            d = types.Datum(
                model_input=types.ModelInput.from_ints([1, 2]),
                loss_fn_inputs={"target_tokens": [2, 3], "weights": weights},
            )
            req = types.ForwardBackwardRequest(
                forward_backward_input=types.ForwardBackwardInput(
                    data=[d], loss_fn="cross_entropy"
                ),
                model_id=model_id,
                seq_id=seq_id,
            )
            body = forward_backward_request_to_proto(req).SerializeToString()
            got = raw.post("/api/v1/forward_backward", content=body, headers=auth | PROTO)
            assert got.status_code == 200, got.text
    cmds = [env.payload for env in trainer.seen[before:]]
    assert len(cmds) == 3 and all(c.datums[0].weights == weights for c in cmds)

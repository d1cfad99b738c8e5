"""SDK pieces without a broker: rollout rows → trainer examples, Tinker-style step semantics."""

from __future__ import annotations

import pytest

from mint.sdk import AdamParams, Datum, TrainingClient, rollouts_to_examples
from mint.sdk.training import UpdateResult
from schemas.events import LoraSpec
from workers.trainer.data import parse_examples


def test_rollout_rows_become_valid_grpo_examples() -> None:
    rows = [
        {
            "prompt_index": 0,
            "sample": 0,
            "prompt": "hi",
            "prompt_token_ids": [1, 5],
            "completion": "ab",
            "token_ids": [7, 8],
            "logprobs": [-0.1, -0.2],
            "reward": 0.5,
        },
        {
            "prompt_index": 0,
            "sample": 1,
            "prompt": "hi",
            "prompt_token_ids": [1, 5],
            "completion": "",
            "token_ids": [],
            "logprobs": [],
            "reward": 0.0,
        },
        {
            "prompt_index": 1,
            "sample": 0,
            "prompt": "yo",
            "prompt_token_ids": [1, 6],
            "completion": "c",
            "token_ids": [9],
            "logprobs": [-0.3],
            "reward": 1.0,
        },
    ]
    ex = rollouts_to_examples(rows)
    assert [e["group"] for e in ex] == [0, 1]  # the empty completion is dropped
    parsed = parse_examples(ex, "rl")  # the trainer's own validation accepts them
    assert parsed[0].completion_ids == [7, 8] and parsed[0].logprobs == [-0.1, -0.2]
    assert parsed[1].reward == 1.0 and parsed[1].prompt_ids == [1, 6]


class FakeClient:
    def __init__(self) -> None:
        self.updates: list[dict] = []

    def latest_revision(self, policy):
        return 3

    def update(self, policy, rows, **kw):
        self.updates.append({"rows": rows, **kw})
        rev = 3 + len(self.updates) if kw["export"] else None
        return UpdateResult(rev, 0.5 / len(self.updates), {"reward_mean": 0.1}, None)


def test_optim_steps_are_sent_lazily_and_the_last_one_exports() -> None:
    c = FakeClient()
    t = TrainingClient(c, "p", "base", LoraSpec())  # type: ignore[arg-type]
    f1 = t.forward_backward([Datum("a", "b", reward=1.0, group=0)])
    t.optim_step(AdamParams(1e-3))
    assert c.updates == []  # held until we know whether the next call saves
    f2 = t.forward_backward([Datum([1, 2], [3], reward=0.0, group=1)])
    assert len(c.updates) == 1 and c.updates[0]["export"] is False
    assert c.updates[0]["learning_rate"] == 1e-3 and c.updates[0]["parent_revision"] == 3
    assert f1.result().loss == 0.5
    t.optim_step()
    sampler = t.save_weights_for_sampler("s1")
    assert c.updates[1]["export"] is True and c.updates[1]["rows"] == [
        {"prompt_ids": [1, 2], "completion_ids": [3], "reward": 0.0, "group": 1, "logprobs": None}
    ]
    assert f2.result().revision == sampler.revision == 5


def test_sft_datum_and_misuse() -> None:
    assert Datum("q", "a").row() == {"prompt": "q", "completion": "a"}
    t = TrainingClient(FakeClient(), "p", "base", LoraSpec())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optim_step without forward_backward"):
        t.optim_step()

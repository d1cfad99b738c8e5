"""The arithmetic task: disjoint split, answers parsed from the question, rewards that grade."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.evaluator.suites import get_suite
from workers.serving import arithmetic
from workers.serving.rewards import get_reward

pytestmark = pytest.mark.unit


def _sum_of(prompt: str) -> frozenset[int]:
    a, b = (int(x) for x in prompt.split("?")[0].removeprefix("What is ").split(" + "))
    return frozenset((a, b))


def test_training_and_held_out_sums_never_overlap_in_either_order() -> None:
    held = arithmetic.held_out_prompts()
    assert len(held) == len(set(held)) == 30  # 16 pairs, both orders, doubles once
    seen = set()
    for seed in range(60):
        batch = arithmetic.training_prompts(8, seed)
        assert len(set(batch)) == 8
        assert not {_sum_of(q) for q in held} & {_sum_of(q) for q in batch}
        seen |= set(batch)
    assert len(seen) + len(held) == 81
    assert arithmetic.training_prompts(8, 3) == arithmetic.training_prompts(8, 3)
    with pytest.raises(ValueError, match="1…51"):
        arithmetic.training_prompts(52, 0)


def test_held_out_suite_is_chat_greedy_and_graded_on_the_answer() -> None:
    suite = get_suite("arith-heldout")
    assert suite.chat and suite.reward == "arith_correct" and suite.temperature == 0.0
    assert suite.prompts == arithmetic.held_out_prompts()


@pytest.mark.parametrize(
    ("completion", "exact", "correct"),
    [
        ("12", 1.0, 1.0),
        (" 12.", 1.0, 1.0),
        ("7 + 5 = 12", 0.0, 1.0),
        ("The answer is 12.", 0.0, 1.0),
        ("13", 0.0, 0.0),
        ("12 apples, or 13", 0.0, 0.0),
        ("To solve this, we need to convert 7", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_rewards_grade_answers(completion: str, exact: float, correct: float) -> None:
    prompt = "What is 7 + 5? Answer with just the number."
    assert get_reward("arith_exact")(prompt, completion, [0] * 7) == exact
    assert get_reward("arith_correct")(prompt, completion, [0] * 7) == correct
    shaped = get_reward("arith_shaped")(prompt, completion, [0] * 7)
    assert (shaped >= 0.6) if correct else shaped == 0.0


def test_shorter_right_answers_earn_more() -> None:
    prompt = "What is 2 + 2? Answer with just the number."
    wordy = arithmetic.shaped_reward(prompt, "2 plus 2 equals 4", 10)
    short = arithmetic.shaped_reward(prompt, "2+2=4", 5)
    bare = arithmetic.shaped_reward(prompt, "4", 2)
    assert 0.6 <= wordy < short < bare == 1.0


def test_a_prompt_that_is_not_a_question_is_refused_with_the_expected_form() -> None:
    with pytest.raises(ValueError, match=r"What is 3 \+ 4\?"):
        get_reward("arith_exact")("hello world", "4", [1])


@given(st.text(max_size=64))
def test_any_completion_gets_a_reward_in_range(completion: str) -> None:
    prompt = "What is 9 + 9? Answer with just the number."
    assert 0.0 <= arithmetic.shaped_reward(prompt, completion, len(completion)) <= 1.0
    assert arithmetic.exact_reward(prompt, completion) in (0.0, 1.0)

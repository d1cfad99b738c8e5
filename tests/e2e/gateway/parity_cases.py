"""The requests of the parity test (test_vllm_serve_parity.py): what a `vllm serve` user sends, on
both endpoints, /tokenize and /detokenize, and the bad inputs `vllm serve` refuses.

Every body leaves out ``model`` (each side gets its own name). Answers are compared at
temperature 0, or sampled with a seed, so both servers must give the same text. A case with a
``rule`` is one where MinT answers otherwise by a documented MinT rule (gateway/README.md, "What
`vllm serve` does, what MinT does"): the test asserts the rule instead of equality.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MODEL_LEN = 256  # both engines'
# SmolLM2's tokenizer: "." 30, " yes" 9805, " no" 787, " maybe" 5196, " Paris" 7042, "," 28
DOT, YES, NO, MAYBE, PARIS, COMMA = 30, 9805, 787, 5196, 7042, 28
PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


@dataclass(frozen=True)
class Rule:
    """A documented MinT rule that makes MinT answer otherwise than `vllm serve`."""

    name: str  # the README row it is
    vllm_status: int
    mint_status: int
    mint_code: str | None = None


@dataclass(frozen=True)
class Case:
    name: str
    route: str  # chat, completions, tokenize, detokenize
    body: dict[str, Any]
    rule: Rule | None = None
    compare_text: bool = True  # 200s: same text, tokens, finish reasons and logprobs
    missing_model: bool = False  # ask for a model neither side has
    known: str | None = None  # a difference found and reported, not fixed yet (strict xfail)

    @property
    def bad(self) -> bool:
        return self.name.startswith("bad_")


ASK = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
CHAT = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Name another one."},
]
WEATHER = {"role": "user", "content": "What is the weather in Paris, in celsius?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Rome"]},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
# "The capital is " then one city: xgrammar's structural tag format (vLLM's structural_tag)
TAG = {
    "type": "structural_tag",
    "format": {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": "The capital is "},
            {"type": "json_schema", "json_schema": {"type": "string", "enum": ["Paris", "Rome"]}},
        ],
    },
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
GREEDY = {"temperature": 0}
LONG = "word " * 400  # past the 256-token context on its own


def chat(name: str, max_tokens: int | None = 8, messages=ASK, **body: Any) -> Case:
    sized = {} if max_tokens is None else {"max_tokens": max_tokens}
    case = {k: body.pop(k) for k in ("rule", "missing_model", "known") if k in body}
    return Case(name, "chat", {"messages": messages, **sized, **GREEDY, **body}, **case)


def comp(name: str, max_tokens: int | None = 8, prompt="The capital of France is", **body) -> Case:
    sized = {} if max_tokens is None else {"max_tokens": max_tokens}
    case = {k: body.pop(k) for k in ("rule", "missing_model", "known") if k in body}
    return Case(name, "completions", {"prompt": prompt, **sized, **GREEDY, **body}, **case)


NAMED = {"type": "function", "function": {"name": "get_weather"}}
# Differences found by this test and reported (issue 33), each a strict xfail until fixed.
CASES: list[Case] = [
    # ---------------------------------------------------------------- chat
    chat("chat_greedy_default_max_tokens", None, messages=CHAT),  # ends early (EOS)
    chat("chat_logprobs_top3", 4, logprobs=True, top_logprobs=3),
    chat(
        "chat_top_k_min_p_penalties",
        8,
        top_k=5,
        min_p=0.05,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.5,
    ),
    chat("chat_stop_include_stop_str", 24, stop=["e"], include_stop_str_in_output=True),
    chat("chat_min_tokens_ignore_eos", 4, min_tokens=4, ignore_eos=True),
    chat(
        "chat_logit_bias_bad_words_stop_token_ids",
        16,
        logit_bias={str(PARIS): -100},
        bad_words=["France"],
        stop_token_ids=[DOT, COMMA],
    ),
    chat("chat_allowed_token_ids", 4, allowed_token_ids=[YES, NO, MAYBE]),
    chat(
        "chat_max_completion_tokens_wins_truncate_prompt",
        20,
        max_completion_tokens=4,
        truncate_prompt_tokens=12,
    ),
    chat("chat_json_schema", 24, messages=[WEATHER], response_format=JSON_SCHEMA),
    chat("chat_json_object", 8, messages=[WEATHER], response_format={"type": "json_object"}),
    chat("chat_choice", 6, structured_outputs={"choice": ["yes", "no", "maybe"]}),
    chat("chat_regex", 8, structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"}),
    chat("chat_structural_tag", 12, structured_outputs={"structural_tag": json.dumps(TAG)}),
    chat("chat_response_format_structural_tag", 12, response_format=TAG),
    chat(
        "chat_json_object_compact",
        12,
        messages=[WEATHER],
        structured_outputs={"json_object": True, "disable_any_whitespace": True},
    ),
    chat("chat_tools_none", 6, messages=[WEATHER], tools=TOOLS, tool_choice="none"),
    chat("chat_tools_auto", 6, messages=[WEATHER], tools=TOOLS),
    chat(
        "chat_tools_required",
        40,  # a whole call: the envelope alone is ~15 tokens
        messages=[WEATHER],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
    ),
    chat(
        "chat_tools_named",
        40,  # a whole call: the envelope alone is ~15 tokens
        messages=[WEATHER],
        tools=TOOLS,
        tool_choice=NAMED,
    ),
    chat("chat_n2_seed", 4, n=2, seed=7, temperature=0.9),
    chat(
        "chat_echo_continue_final",
        4,
        messages=[*ASK, {"role": "assistant", "content": "The capital"}],
        add_generation_prompt=False,
        continue_final_message=True,
        echo=True,
    ),
    chat("chat_prompt_logprobs", 4, prompt_logprobs=1),
    chat(
        "chat_stream_json_schema",
        24,
        messages=[WEATHER],
        response_format=JSON_SCHEMA,
        stream=True,
        stream_options={"include_usage": True},
    ),
    chat(
        "chat_stream_tools_named",
        40,  # a whole call: the envelope alone is ~15 tokens
        messages=[WEATHER],
        tools=TOOLS,
        tool_choice=NAMED,
        stream=True,
        stream_options={"include_usage": True},
    ),
    # ---------------------------------------------------------------- completions
    comp("comp_default_max_tokens", None),
    comp("comp_greedy_logprobs_3", 6, logprobs=3),
    comp("comp_echo_logprobs", 4, echo=True, logprobs=1),
    comp("comp_echo_max_tokens_0", 0, echo=True),
    comp("comp_n3_seed", 4, n=3, seed=11, temperature=1.0),
    comp("comp_token_id_prompt", 8, prompt=PROMPT_IDS),
    comp(
        "comp_two_prompts_no_special_tokens",
        6,
        prompt=["The capital of France is", "Two plus two is"],
        add_special_tokens=False,
    ),
    comp(
        "comp_top_k_min_p_penalties",
        8,
        top_k=5,
        min_p=0.05,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.5,
    ),
    comp("comp_min_tokens_ignore_eos", 4, min_tokens=4, ignore_eos=True),
    comp(
        "comp_stops_skip_special_tokens_false",
        24,
        stop=["\n"],
        stop_token_ids=[DOT],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    ),
    comp("comp_regex", 8, structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"}),
    comp("comp_choice", 6, structured_outputs={"choice": ["Paris", "Rome"]}),
    comp("comp_json_schema", 24, response_format=JSON_SCHEMA),
    comp("comp_prompt_logprobs", 4, prompt_logprobs=2),
    comp("comp_truncate_prompt_tokens", 4, truncate_prompt_tokens=3),
    comp("comp_return_token_ids", 2, return_token_ids=True),
    chat("chat_return_token_ids", 2, return_token_ids=True),
    comp("comp_stream", 6, stream=True, stream_options={"include_usage": True}),
    # ---------------------------------------------------------------- tokenize, detokenize
    Case("tokenize_prompt", "tokenize", {"prompt": "Hello world"}),
    Case(
        "tokenize_prompt_strs",
        "tokenize",
        {"prompt": "Hello world", "add_special_tokens": False, "return_token_strs": True},
    ),
    Case("tokenize_messages", "tokenize", {"messages": CHAT, "add_generation_prompt": True}),
    Case("detokenize", "detokenize", {"tokens": [*PROMPT_IDS, DOT]}),
    # vllm serve checks no id here: one past the vocabulary decodes to nothing
    Case("detokenize_past_the_vocabulary", "detokenize", {"tokens": [*PROMPT_IDS, 10**6]}),
    Case("bad_detokenize_negative_id", "detokenize", {"tokens": [-1]}),
    # ---------------------------------------------------------------- bad inputs
    chat("bad_chat_negative_temperature", temperature=-0.5),
    chat("bad_chat_top_p_0", top_p=0),
    comp("bad_comp_max_tokens_0", 0),
    comp("bad_comp_n_0", n=0),
    chat("bad_chat_top_logprobs_50", logprobs=True, top_logprobs=50),
    chat("bad_chat_top_logprobs_without_logprobs", top_logprobs=2),
    chat(
        "bad_chat_schema_not_a_schema",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 5}},
    ),
    comp("bad_comp_regex_does_not_compile", structured_outputs={"regex": "([a-z"}),
    comp("bad_comp_structural_tag_not_a_tag", structured_outputs={"structural_tag": '{"a": 1}'}),
    chat("bad_chat_two_constraints", structured_outputs={"regex": "a+", "choice": ["a"]}),
    chat(
        "bad_chat_tool_choice_names_no_tool",
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "nope"}},
    ),
    chat("bad_chat_tool_choice_without_tools", tool_choice="required"),
    chat("bad_chat_past_context", messages=[{"role": "user", "content": LONG}]),
    comp("bad_comp_past_context", prompt=LONG),
    chat("bad_chat_top_k_negative", top_k=-5),
    chat("bad_chat_model_missing", missing_model=True),
    comp("bad_comp_min_p_2", min_p=2.0),
    comp("bad_comp_repetition_penalty_0", repetition_penalty=0.0),
    comp("bad_comp_logit_bias_key", logit_bias={"abc": 1.0}),
    comp("bad_comp_prompt_logprobs_stream", prompt_logprobs=1, stream=True),
    comp("bad_comp_suffix", suffix="!"),
    comp("bad_comp_five_stops", stop=["a", "b", "c", "d", "e"]),
    comp("bad_comp_empty_prompt", prompt=""),
    chat("bad_chat_no_messages", messages=[]),
    chat("bad_chat_stream_options_without_stream", stream_options={"include_usage": True}),
    # ---------------------------------------------------------------- MinT's own rules
    comp(
        "rule_comp_n_9",
        4,
        n=9,
        seed=1,
        temperature=1.0,
        rule=Rule("n: n × prompts ≤ max_choices (8)", 200, 400, "limit_exceeded"),
    ),
]

"""What an engine runs: each request is checked on its own before it joins a batch.

vLLM's offline ``generate`` aborts the whole batch when one prompt is longer than the model's
context, and ``SamplingParams`` raises for a temperature above 2: one request would fail every
other request of its wave. So each request is admitted alone, with the rules of ``vllm serve``
(0.32, ``renderers/params.py`` and ``get_max_tokens``), and refused with its own answer:

- ``max_tokens`` above ``max_model_len``: refused, ``invalid_value`` (vLLM serve: "max_tokens
  cannot be greater than max_model_len");
- prompt tokens (after the chat template) ``>= max_model_len``: refused,
  ``context_length_exceeded`` (vLLM serve refuses more than ``max_model_len``, and at exactly
  ``max_model_len`` its clamped ``max_tokens`` of 0 is refused too: no room for one token);
- prompt + ``max_tokens`` above ``max_model_len``: ``max_tokens`` is *clamped* to what is left
  (vLLM serve's ``get_max_tokens``); the answer then ends with ``finish_reason`` ``length``;
- temperature outside [0, 2], top_p outside (0, 1], a seed outside 64 bits, an empty prompt:
  refused, ``invalid_value``;
- a prompt sent as token ids (``prompt_token_ids``) with an id outside the model's vocabulary:
  refused, ``invalid_value`` (vLLM serve: "Token id ... is out of vocabulary"; offline, it would
  fail the batch).

The wire schema accepts temperatures up to 10 (released contract; a tighter bound would turn
such a request into a dead letter that its caller never hears about): the engine refuses them.
"""

from __future__ import annotations

import math
from dataclasses import replace

from workers.serving.exceptions import RequestRefused
from workers.serving.generation import GenRequest

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
INVALID_VALUE = "invalid_value"
MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses more
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


def admit(
    r: GenRequest, *, prompt_tokens: int, max_model_len: int, vocab_size: int | None = None
) -> GenRequest:
    """``r`` as the engine runs it (``max_tokens`` clamped to the context left), or
    :class:`RequestRefused` naming the value, the limit and what to send instead.
    ``vocab_size``: check the ids of a token prompt against it (the caller's ids, not ours)."""
    if not (math.isfinite(r.temperature) and 0.0 <= r.temperature <= MAX_TEMPERATURE):
        raise RequestRefused(
            f"temperature={r.temperature} is outside what this engine runs (0 to "
            f"{MAX_TEMPERATURE:g}, vLLM's range); send a temperature between 0 and "
            f"{MAX_TEMPERATURE:g}",
            code=INVALID_VALUE,
        )
    if not 0.0 < r.top_p <= 1.0:
        raise RequestRefused(
            f"top_p={r.top_p} is outside (0, 1]; send a top_p above 0 and at most 1",
            code=INVALID_VALUE,
        )
    if r.seed is not None and not SEED_RANGE[0] <= r.seed <= SEED_RANGE[1]:
        raise RequestRefused(
            f"seed={r.seed} does not fit in 64 bits; send a seed between 0 and {2**63 - 1}",
            code=INVALID_VALUE,
        )
    if r.max_tokens > max_model_len:
        raise RequestRefused(
            # vLLM serve's words first, then what to send instead
            f"max_tokens={r.max_tokens} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (This model's context holds prompt and "
            f"completion together; with this prompt of {prompt_tokens} tokens ask for at most "
            f"{max(1, max_model_len - prompt_tokens)} completion tokens.)",
            code=INVALID_VALUE,
        )
    if prompt_tokens < 1:
        raise RequestRefused(
            "the prompt is empty after tokenization; send a prompt with some text",
            code=INVALID_VALUE,
        )
    if vocab_size is not None and isinstance(r.prompt, list):
        _check_vocabulary(r.prompt, vocab_size)
    if prompt_tokens >= max_model_len:
        raise RequestRefused(
            _too_long(max_model_len, prompt_tokens) + f" (The prompt has {prompt_tokens} tokens"
            f"{' after the chat template' if r.chat else ''}, which leaves no room for a "
            f"completion; shorten the prompt to at most "
            f"{max_model_len - min(r.max_tokens, max_model_len - 1)} tokens for "
            f"max_tokens={r.max_tokens}{', or send fewer messages' if r.messages else ''}.)",
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    room = max_model_len - prompt_tokens
    return replace(r, max_tokens=room) if r.max_tokens > room else r


def _too_long(max_model_len: int, prompt_tokens: int) -> str:
    """vLLM serve's (0.32) words for a prompt that leaves no room for one output token."""
    if prompt_tokens == max_model_len:
        return "max_tokens must be at least 1, got 0."
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains at least {max_model_len + 1} input tokens, which exceeds this limit even "
        "without any output tokens. Please reduce the length of the input prompt."
    )


def _check_vocabulary(ids: list[int], vocab_size: int) -> None:
    bad = next((k for k, t in enumerate(ids) if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestRefused(
            f"prompt_token_ids[{bad}]={ids[bad]} is outside this model's vocabulary of "
            f"{vocab_size} token ids (0 to {vocab_size - 1}); send ids from this base model's "
            "tokenizer",
            code=INVALID_VALUE,
        )


def truncate(ids: list[int], k: int | None, max_model_len: int) -> list[int]:
    """The prompt's last ``k`` tokens (``truncate_prompt_tokens``, as vLLM serve: -1 is the
    model's context; cut on the left, so the end of the prompt, the question, stays)."""
    if k is None:
        return ids
    if k > max_model_len:
        raise RequestRefused(
            f"truncate_prompt_tokens={k} cannot be greater than max_model_len = "
            f"{max_model_len}. Please request a smaller truncation size.",
            code=INVALID_VALUE,
        )
    k = max_model_len if k == -1 else k
    return ids[-k:] if 0 < k < len(ids) else ids

"""Log-probabilities in ``vllm serve``'s shapes (its ``_create_chat_logprobs``,
``_create_completion_logprobs`` and ``prompt_logprobs``), from the engine's
``TokenLogprob`` (token id, string, bytes, logprob, ``top`` alternatives).

vLLM keeps a position's candidates as one dict: the sampled token first, then the top k in
rank order without it (a token already there is not listed twice). :func:`candidates` rebuilds
that order from a ``TokenLogprob`` whether or not its ``top`` holds the sampled token.
Chat lists the first ``top_logprobs`` of them; completions map the first ``logprobs + 1``
(OpenAI's rule) by token string. -inf is written -9999.0, as vLLM does.
"""

from __future__ import annotations

from typing import Any

from gateway.tokenize import BaseTokenizer
from schemas.events import InferChoice
from schemas.events.sampling import TokenLogprob, TopLogprob

FLOOR = -9999.0


def _lp(value: float) -> float:
    return max(value, FLOOR)


def candidates(t: TokenLogprob) -> list[TopLogprob]:
    """vLLM's dict order: the sampled token, then the alternatives without it."""
    return [t, *(x for x in t.top if x.token_id != t.token_id)]


def _take(entries: list[TopLogprob], k: int | None, extra: int = 0) -> list[TopLogprob]:
    if k is None:
        return []
    if k == -1:
        return entries
    return entries[: max(k + extra, 0)]


class TokenText:
    """How a token is written: its string, or ``token_id:<id>`` (vLLM's
    ``return_tokens_as_token_ids``); a token without a string is decoded with the gateway's
    tokenizer when it has one."""

    def __init__(self, as_ids: bool, tokenizer: BaseTokenizer | None) -> None:
        self.as_ids, self.tokenizer = as_ids, tokenizer

    def __call__(self, token_id: int, token: str | None) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
        if token is not None:
            return token
        if self.tokenizer is not None:
            return self.tokenizer.decode([token_id])
        return f"token_id:{token_id}"


def sampled(c: InferChoice) -> list[TokenLogprob]:
    """A choice's tokens with their logprobs; an engine that sends only the floats (older than
    ``token_logprobs``) gives tokens without strings."""
    if c.token_logprobs is not None:
        return list(c.token_logprobs)
    if c.logprobs is None:
        return []
    return [
        TokenLogprob(token_id=t, token="", logprob=lp, bytes=None)
        for t, lp in zip(c.token_ids, c.logprobs, strict=False)
    ]


def _text_of(t: TopLogprob, text: TokenText) -> str:
    return text(t.token_id, t.token if t.token or t.bytes else None)


def chat_content(
    tokens: list[TokenLogprob], k: int | None, text: TokenText
) -> list[dict[str, Any]]:
    """``logprobs.content`` of a chat choice (or of a streamed part of it)."""
    out = []
    for t in tokens:
        token = _text_of(t, text)
        raw = t.bytes if t.bytes is not None and not text.as_ids else None
        out.append(
            {
                "token": token,
                "logprob": _lp(t.logprob),
                "bytes": raw if raw is not None else list(token.encode("utf-8", "replace")),
                "top_logprobs": [
                    {
                        "token": (alt := _text_of(x, text)),
                        "logprob": _lp(x.logprob),
                        "bytes": list(alt.encode("utf-8", "replace")),
                    }
                    for x in _take(candidates(t), k)
                ],
            }
        )
    return out


def completion_logprobs(
    tokens: list[TokenLogprob | None],
    ids: list[int],
    k: int,
    text: TokenText,
    offset: int = 0,
) -> dict[str, Any]:
    """``logprobs`` of a completion choice: ``tokens`` (None where a position has none: the
    first prompt token of an echo), ``ids`` their token ids, ``offset`` the first token's text
    offset."""
    out: dict[str, list[Any]] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    last = 0
    for t, token_id in zip(tokens, ids, strict=False):
        if t is None:
            token = text(token_id, None)
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            token = _text_of(t, text)
            out["token_logprobs"].append(_lp(t.logprob))
            out["top_logprobs"].append(
                {_text_of(x, text): _lp(x.logprob) for x in _take(candidates(t), k, extra=1)}
            )
        out["tokens"].append(token)
        out["text_offset"].append(
            offset if not out["text_offset"] else out["text_offset"][-1] + last
        )
        last = len(token)
    return out


def prompt_logprobs_body(
    logprobs: list[TokenLogprob | None] | None,
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt token, None or ``{token id: {logprob, rank,
    decoded_token}}`` for the token and its alternatives."""
    if logprobs is None:
        return None
    return [
        None
        if t is None
        else {
            str(x.token_id): {
                "logprob": _lp(x.logprob),
                "rank": getattr(x, "rank", None),
                "decoded_token": x.token,
            }
            for x in candidates(t)
        }
        for t in logprobs
    ]

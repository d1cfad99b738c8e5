"""What one generation is: the request an engine runs, its result, and the stream of text a
request hands on while vLLM generates it (``DeltaStream``), with vLLM's per-token
log-probabilities as an answer carries them (``token_logprob``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.events.sampling import SamplingOptions, TokenLogprob, TopLogprob


@dataclass(frozen=True)
class LoraHandle:
    """An adapter as vLLM knows it: content-derived int id, name and local directory."""

    lora_id: int
    name: str
    path: Path


@dataclass(frozen=True)
class GenRequest:
    prompt: str | list[int]
    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    n: int = 1
    logprobs: bool = False
    lora: LoraHandle | None = None
    chat: bool = False  # render a text prompt as one user turn of the model's chat template
    # With chat: the whole conversation ({"role", "content"} turns) instead of one user turn.
    messages: tuple[dict[str, str], ...] | None = None
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    options: SamplingOptions | None = None  # vLLM's other settings (workers.serving.sampling)


@dataclass
class GenSample:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    token_logprobs: list[TokenLogprob] | None = None  # with options.top_logprobs
    stop_reason: str | int | None = None


@dataclass
class GenResult:
    prompt_token_ids: list[int]
    samples: list[GenSample] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # with options.prompt_logprobs


# A stream's text leaves the engine at least this often, or every DELTA_TOKENS tokens of one
# request: deltas small enough to read as a stream, few enough not to cost a record per token.
DELTA_INTERVAL_S = 0.05
DELTA_TOKENS = 16

# on_delta(choice index, text added, tokens added); on_done(result, or the error that ended it)
OnDelta = Callable[[int, str, int], None]
OnDone = Callable[[GenResult | None, BaseException | None], None]


def shared_prefixes(requests: list[GenRequest]) -> list[GenRequest]:
    """The requests to prefill before a batch: one chat prompt per adapter that has several in
    the batch (they share the template's leading blocks: the system turn). Requests with n > 1
    warm their own prompt (VllmEngine._run)."""
    counts = Counter(_adapter(r) for r in requests if r.n == 1 and r.chat)
    first: dict[int, GenRequest] = {}
    for r in requests:
        if r.n == 1 and r.chat and counts[_adapter(r)] > 1:
            first.setdefault(_adapter(r), r)
    return list(first.values())


def _adapter(r: GenRequest) -> int:
    return r.lora.lora_id if r.lora else 0


class DeltaStream:
    """One request's outputs as vLLM hands them over (deltas, per choice): the whole result
    assembled, and the text passed on to ``on_delta`` every DELTA_INTERVAL_S or DELTA_TOKENS."""

    def __init__(
        self, n: int, on_delta: OnDelta | None, *, top: int | None = None, prompt: bool = False
    ) -> None:
        """``top``: keep each token with its string and ``top`` alternatives (top_logprobs);
        ``prompt``: keep the prompt's logprobs (prompt_logprobs)."""
        self.on_delta, self.top, self.prompt = on_delta, top, prompt
        self.prompt_token_ids: list[int] = []
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.samples = [
            GenSample("", [], [], "length", token_logprobs=[] if top is not None else None)
            for _ in range(n)
        ]
        self._pending = [["", 0] for _ in range(n)]  # text and tokens not passed on yet
        self._last = [0.0] * n  # when each choice last passed text on (0: never)

    def add(self, out) -> None:
        if out.prompt_token_ids and not self.prompt_token_ids:
            self.prompt_token_ids = list(out.prompt_token_ids)
        if self.prompt and self.prompt_logprobs is None and out.prompt_logprobs is not None:
            self.prompt_logprobs = [
                token_logprob(t, lp, len(lp)) if lp else None
                for t, lp in zip(self.prompt_token_ids, out.prompt_logprobs, strict=False)
            ]
        now = time.monotonic()
        for o in out.outputs:
            s, pending = self.samples[o.index], self._pending[o.index]
            s.text += o.text
            s.token_ids += o.token_ids
            s.logprobs += [
                lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs or [], strict=False)
            ]
            if s.token_logprobs is not None and o.logprobs:
                s.token_logprobs += [
                    token_logprob(t, lp, self.top or 0)
                    for t, lp in zip(o.token_ids, o.logprobs, strict=False)
                ]
            if o.finish_reason:
                s.finish_reason = o.finish_reason
                s.stop_reason = o.stop_reason
            pending[0] += o.text
            pending[1] += len(o.token_ids)
            if self.on_delta is None or not pending[0]:
                continue
            # The first text leaves at once (time to first token), the rest in small batches.
            due = (
                self._last[o.index] == 0.0
                or now - self._last[o.index] >= DELTA_INTERVAL_S
                or pending[1] >= DELTA_TOKENS
                or o.finish_reason is not None
            )
            if due:
                self.on_delta(o.index, pending[0], pending[1])
                pending[0], pending[1] = "", 0
                self._last[o.index] = now

    def result(self) -> GenResult:
        return GenResult(self.prompt_token_ids, self.samples, self.prompt_logprobs)


def token_logprob(token_id: int, candidates: dict[int, Any], top: int) -> TokenLogprob:
    """One position of vLLM's logprobs (token id -> Logprob(logprob, rank, decoded_token)): the
    sampled token and its ``top`` alternatives by rank, with strings and UTF-8 bytes as
    ``vllm serve`` returns them."""
    own = candidates[token_id]
    ranked = sorted(candidates.items(), key=lambda kv: kv[1].rank or 0)[:top]
    return TokenLogprob(
        **_entry(token_id, own), top=[TopLogprob(**_entry(t, lp)) for t, lp in ranked]
    )


def _entry(token_id: int, lp: Any) -> dict[str, Any]:
    token = lp.decoded_token if lp.decoded_token is not None else ""
    return {
        "token_id": token_id,
        "token": token,
        "logprob": max(lp.logprob, -9999.0),  # -inf is not JSON; vllm serve clamps the same
        "bytes": list(token.encode("utf-8", errors="replace")),
    }

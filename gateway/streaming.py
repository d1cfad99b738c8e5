"""Server-sent events made from an answer while it is generated: deltas as they come, the
completion to finish (and to fill what the deltas missed), in OpenAI's (and vLLM serve's)
chunk shapes.

A chat stream opens with one chunk per choice whose delta is ``{"role": "assistant",
"content": ""}`` (vLLM sends the role first), then ``{"content": text}`` chunks, then per choice a
chunk with its ``finish_reason`` and an empty delta; a completion stream sends ``text`` chunks
the same way. With ``stream_options.include_usage`` a last chunk has no choices and the usage;
then ``data: [DONE]``.

Reconciliation (:class:`StreamChunks`): deltas (``infer.deltas``) and the completion
(``infer.results``) travel on two topics that are not ordered together, and the completion is
the authority. A delta is sent only when its ``offset`` is exactly the number of characters
already sent for its choice; a repeat or a delta after a gap is dropped, so text is never sent
twice and never out of order. When the completion comes, each choice gets the part of its text
not yet sent (``text[sent:]``), then its finish chunk; deltas that arrive later are dropped.

Logprobs come only with the completion (deltas carry text), so the whole choice's logprobs go
on the completion's content chunk, sent just before the finish chunk (with empty content when
the deltas had sent all the text): a client that joins the chunks' ``logprobs.content`` lists
gets every token once, in order. ``system_fingerprint`` (the adapter digest) is known from the
completion on: earlier chunks carry ``null``, as vLLM's do.

Tool calls (the tool parser on, any tool choice but ``none``): the calls are read from the whole
answer (the hermes envelope), so the text is held back and the message (content and tool calls)
comes whole with the completion; vllm serve streams a call's arguments as they come. Echo: completions send the
prompt first, chat the last message after the role chunk.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from gateway.asks import Ask
from gateway.bodies import ChatRequest
from gateway.deltas import Answers
from gateway.errors import ApiError, Unavailable
from gateway.responses import (
    chat_logprobs,
    chat_message,
    check_choices,
    completion_choice_logprobs,
    failed_error,
    fingerprint,
    finish,
    usage,
)
from schemas.envelope import Envelope
from schemas.events import InferCompleted, InferDelta, InferFailed

log = structlog.get_logger()


@dataclass
class _Choice:
    sent: list[str] = field(default_factory=list)  # the text sent, delta by delta
    chars: int = 0
    finished: bool = False


@dataclass
class StreamChunks:
    """The chunks of one stream: ``prompts`` requests of ``n`` choices each (prompt k's choice
    j is choice ``k * n + j``). Feed it events with :meth:`delta` and :meth:`completed`."""

    ask: Ask
    rid: str
    created: int
    model: str
    prompts: int
    include_usage: bool
    done: list[InferCompleted] = field(default_factory=list)
    dropped: int = 0  # deltas not sent: repeats, after a gap, after the completion

    def __post_init__(self) -> None:
        self.chat, self.n = self.ask.chat, self.ask.n
        self.choices = [_Choice() for _ in range(self.n * self.prompts)]
        req = self.ask.req
        parser_on = self.ask.tools.parser is not None and isinstance(req, ChatRequest)
        # the calls are read from the whole answer, so its text is held back until the end
        self.hold = (
            parser_on
            and isinstance(req, ChatRequest)
            and bool(req.tools)
            and req.tool_choice != "none"
        )

    def _chunk(self, index: int, body: dict[str, Any], reason: str | None) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(self.done) if self.done else None,
            "choices": [{"index": index, **body, "finish_reason": reason}],
        }

    def _text(self, index: int, text: str, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        body = {"delta": {"content": text}} if self.chat else {"text": text}
        return self._chunk(index, {**body, "logprobs": logprobs}, None)

    def opening(self) -> list[dict[str, Any]]:
        """Chat: each choice's role chunk (then the echoed last message); completions with
        echo: each choice's prompt."""
        out = []
        for i in range(len(self.choices)):
            if self.chat:
                role = {"delta": {"role": self.ask.role, "content": ""}, "logprobs": None}
                out.append(self._chunk(i, role, None))
                if self.ask.echo_prefix:
                    echo = {"delta": {"content": self.ask.echo_prefix}, "logprobs": None}
                    out.append(self._chunk(i, echo, None))
            elif self.ask.req.echo:
                k = i // self.n
                prompt = self.ask.prompt_texts[k] if k < len(self.ask.prompt_texts) else ""
                out.append(self._chunk(i, {"text": prompt, "logprobs": None}, None))
        return out

    def delta(self, k: int, d: InferDelta) -> list[dict[str, Any]]:
        """The chunk of delta ``d`` of prompt ``k``, if it continues its choice's text."""
        if d.index >= self.n:
            self.dropped += 1
            return []
        index = k * self.n + d.index
        choice = self.choices[index]
        if choice.finished or d.offset != choice.chars:  # a repeat, or after a gap
            self.dropped += 1
            return []
        if not d.text or self.hold or self.ask.echo_only:
            return []
        out = [self._text(index, d.text, None)]
        choice.sent.append(d.text)
        choice.chars += len(d.text)
        return out

    def completed(self, k: int, p: InferCompleted) -> list[dict[str, Any]]:
        """Per choice of prompt ``k``: the text the deltas did not send (with the choice's
        logprobs), then its finish chunk. EngineFailed when the answer lacks choices."""
        answered = check_choices(p, self.n)
        self.done.append(p)
        out = []
        for c in answered:
            index = k * self.n + c.index
            choice = self.choices[index]
            sent = "".join(choice.sent)
            if not c.text.startswith(sent):  # the engine's deltas were not a prefix: cannot unsend
                log.warning(
                    "streamed text differs from the completion",
                    request_id=p.request_id,
                    choice=c.index,
                    sent_chars=len(sent),
                )
            if self.chat:
                logprobs = chat_logprobs(self.ask, c)
                message, reason = chat_message(self.ask, c, streamed=self.hold)
            else:
                logprobs = completion_choice_logprobs(self.ask, k, p, c)
                reason = finish(c)
            if self.hold:  # the whole message at once: its content and tool calls
                delta = {
                    key: message[key]
                    for key in ("content", "tool_calls")
                    if message.get(key) not in (None, "", [])
                }
                if "tool_calls" in delta:  # a streamed call names its place in the list
                    delta["tool_calls"] = [
                        {"index": i, **call} for i, call in enumerate(delta["tool_calls"])
                    ]
                out.append(self._chunk(index, {"delta": delta, "logprobs": logprobs}, None))
            else:
                rest = "" if self.ask.echo_only else c.text[choice.chars :]
                if rest or logprobs is not None:
                    out.append(self._text(index, rest, logprobs))
                    choice.sent.append(rest)
            choice.finished, choice.chars = True, len(c.text)
            end = {"delta": {}} if self.chat else {"text": ""}
            body = {**end, "logprobs": None, "stop_reason": c.stop_reason}
            out.append(self._chunk(index, body, reason))
        return out

    def closing(self) -> list[dict[str, Any]]:
        """The usage chunk, when asked for (after every prompt's completion)."""
        if not self.include_usage:
            return []
        head = self._chunk(0, {}, None)
        return [{**head, "choices": [], "usage": usage(self.done)}]


def _data(chunk: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(chunk, separators=(",", ":"))}


async def sse(
    answers: Answers,
    first: list[tuple[int, Envelope[Any]]],
    chunks: StreamChunks,
    *,
    retry_after_s: int = 5,
    prompt_param: str | None = None,
    log_fields: dict[str, Any] | None = None,
    on_answered: Callable[[list[InferCompleted]], None] = lambda _done: None,
) -> AsyncIterator[dict[str, str]]:
    """The events of a stream whose ``first`` events were read already (no failure among them).
    An error after the stream started (an engine failing mid-generation, the deadline) is sent
    as a ``data: {"error": …}`` event, as vLLM does, then ``[DONE]``. However the stream ends
    (done, failed, or the client gone: the generator is cancelled or closed), the requests not
    answered are cancelled. ``on_answered(done)`` once every prompt is answered."""
    pending = deque(first)
    answered: set[int] = set()
    error: ApiError | None = None
    try:
        for chunk in chunks.opening():
            yield _data(chunk)
        while len(answered) < len(answers.envs):
            if pending:
                k, env = pending.popleft()
            else:
                try:
                    k, env = await answers.next()
                except TimeoutError:
                    error = Unavailable(
                        f"the answer was not finished within {answers.timeout_s:g} s; retry "
                        "later or ask for fewer tokens",
                        headers={"Retry-After": str(retry_after_s)},
                    )
                    break
            p = env.payload
            try:
                if isinstance(p, InferDelta):
                    out = chunks.delta(k, p)
                elif isinstance(p, InferFailed):
                    raise failed_error(p, chunks.model, retry_after_s, prompt_param)
                else:
                    out = chunks.completed(k, p)
                    answered.add(k)
            except ApiError as e:
                error = e
                break
            for chunk in out:
                yield _data(chunk)
        if error is not None:
            yield _data(error.body())
        else:
            on_answered(chunks.done)
            for chunk in chunks.closing():
                yield _data(chunk)
        yield {"data": "[DONE]"}
    finally:
        answers.close()  # cancels whatever is not answered (a client gone, a failure)
        log.info(
            "stream ended"
            if error is None and len(answered) == len(answers.envs)
            else "stream stopped",
            **(log_fields or {}),
            choices=len(chunks.choices),
            deltas_dropped=chunks.dropped,
            error=error.code if error is not None else None,
            ms=round((time.perf_counter() - answers.started) * 1000, 1),
        )

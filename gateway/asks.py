"""What the engines are asked for one HTTP request: one ``infer.requested`` per prompt, and
what the answer needs to be read back as ``vllm serve`` would write it (:class:`Ask`).

Chat prompts are rendered by the engine's chat template from ``InferRequested.messages`` when
the conversation is plain turns (``system``/``user``/``assistant`` with text): one template
implementation. What those turns cannot carry (tool turns, assistant ``tool_calls``, other
roles, ``name``, ``tools`` for the template, ``add_generation_prompt: false``,
``continue_final_message``, ``chat_template_kwargs``, ``documents``, ``add_special_tokens``)
is rendered here with the base model's tokenizer, as vLLM renders it, and sent as
``prompt_token_ids``. Completion prompts given as token ids travel as ``prompt_token_ids``;
text prompts as text (or as token ids when ``add_special_tokens`` is false).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gateway.bodies import ChatRequest, CompletionRequest, Message
from gateway.errors import BadRequest
from gateway.sampling import event_fields, max_tokens_of, prompt_label
from gateway.tokenize import BaseTokenizer
from gateway.tools import ToolOptions, tool_dicts
from schemas.events import ChatTurn, InferRequested

ENGINE_ROLES = {"system", "user", "assistant"}


@dataclass
class Ask:
    """A request as asked: its payloads (one per prompt) and how to write the answer."""

    req: ChatRequest | CompletionRequest
    payloads: list[InferRequested]
    tools: ToolOptions = field(default_factory=ToolOptions)
    tokenizer: BaseTokenizer | None = None
    prompt_texts: list[str] = field(default_factory=list)  # completions echo
    echo_only: bool = False  # completions echo with max_tokens 0: the prompt alone
    role: str = "assistant"  # the chat answer's role
    echo_prefix: str = ""  # chat echo: the last message's content, when its role is `role`

    @property
    def chat(self) -> bool:
        return isinstance(self.req, ChatRequest)

    @property
    def n(self) -> int:
        return self.req.n or 1

    @property
    def top(self) -> int | None:
        """Alternatives per token the answer lists (None: no logprobs)."""
        if isinstance(self.req, ChatRequest):
            return self.req.top_logprobs if self.req.logprobs else None
        return self.req.logprobs


def gateway_render_reason(req: ChatRequest) -> str | None:
    """Why this conversation must be rendered on the gateway (None: the engine can). Raised
    reasons need the base model's tokenizer here."""
    for i, m in enumerate(req.messages):
        if m.role not in ENGINE_ROLES | {"developer"}:
            return f"messages[{i}].role {m.role!r}"
        if m.tool_calls:
            return f"messages[{i}].tool_calls"
        if m.tool_call_id is not None:
            return f"messages[{i}].tool_call_id"
    if not req.add_generation_prompt:
        return "add_generation_prompt false"
    if req.continue_final_message:
        return "continue_final_message"
    if req.chat_template_kwargs:
        return "chat_template_kwargs"
    if req.documents:
        return "documents"
    if req.add_special_tokens:
        return "add_special_tokens"
    return None


def prefers_gateway_render(req: ChatRequest) -> bool:
    """What the engine renders close to vLLM but not exactly: ``developer`` turns (sent as
    ``system``), ``name`` (dropped) and ``tools`` (not shown to the template). With the
    tokenizer here, these are rendered exactly."""
    return bool(req.tools) or any(m.role == "developer" or m.name for m in req.messages)


def uses_tokenizer(req: ChatRequest | CompletionRequest) -> bool:
    """Whether the base model's tokenizer on the gateway serves this request: a template
    rendered here, a prompt tokenized or decoded here, the string of an echoed prompt's first
    token. :func:`build` refuses what cannot be done without it, saying what needed it."""
    if isinstance(req, ChatRequest):
        return gateway_render_reason(req) is not None or prefers_gateway_render(req)
    prompts = req.prompts()
    ids = any(not isinstance(p, str) for p in prompts)
    return ids or not req.add_special_tokens or (bool(req.echo) and req.logprobs is not None)


def conversation(messages: list[Message]) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to the chat template (``_parse_chat_message_content``
    with the "string" content format, ``_postprocess_messages``)."""
    out = []
    for m in messages:
        turn: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.role == "assistant":
            if m.tool_calls:
                turn["tool_calls"] = [
                    _tool_call(c.model_dump(exclude_none=True)) for c in m.tool_calls
                ]
            if m.reasoning is not None:
                turn["reasoning"] = turn["reasoning_content"] = m.reasoning
        elif m.role == "tool" and m.tool_call_id is not None:
            turn["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            turn["name"] = m.name
        if m.role == "developer":
            turn["tools"] = None
        out.append(turn)
    return out


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """vLLM: a tool call's ``arguments`` reach the template as a dict (malformed JSON: {})."""
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args else {}
        except ValueError:
            parsed = {}
        fn["arguments"] = parsed if isinstance(parsed, dict) else {}
    elif not args:
        fn["arguments"] = {}
    return {**call, "function": fn}


def render_ids(req: ChatRequest, tok: BaseTokenizer) -> list[int]:
    text = tok.render(
        conversation(req.messages),
        tools=tool_dicts(req.tools),
        documents=req.documents,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        kwargs=req.chat_template_kwargs,
    )
    return tok.encode(text, add_special_tokens=req.add_special_tokens)


def _label(messages: list[Message]) -> str:
    last_user = next((m.text() for m in reversed(messages) if m.role == "user" and m.text()), "")
    return prompt_label(last_user or messages[-1].text())


def build(
    req: ChatRequest | CompletionRequest,
    ids: list[str],
    common: dict[str, Any],
    *,
    default_max_tokens: int,
    tools: ToolOptions,
    tokenizer: BaseTokenizer | None,
) -> Ask:
    """The Ask of ``req`` (``ids``: one request id per prompt; ``common``: alias, revision,
    deadline, stream_to). ``tokenizer``: the base model's, when this gateway has it."""
    fields = {
        **common,
        **event_fields(req, tools),
        "max_tokens": max_tokens_of(req, default_max_tokens),
    }
    if isinstance(req, ChatRequest):
        return _chat(req, ids[0], fields, tools, tokenizer)
    return _completion(req, ids, fields, tools, tokenizer)


def _chat(
    req: ChatRequest,
    rid: str,
    fields: dict[str, Any],
    tools: ToolOptions,
    tok: BaseTokenizer | None,
) -> Ask:
    must = gateway_render_reason(req)
    if must is not None and tok is None:
        raise BadRequest(
            f"{must} needs the chat template rendered on the gateway, and this gateway does not "
            "have the model's base tokenizer; send plain system/user/assistant text turns, or "
            "ask the operators to give the gateway the base model's folder",
            param="messages",
            code="unsupported_parameter",
        )
    label = _label(req.messages)
    if tok is not None and (must is not None or prefers_gateway_render(req)):
        prompt_ids = render_ids(req, tok)
        if not prompt_ids:
            raise BadRequest("The decoder prompt cannot be empty", param="messages")
        payload = _payload(rid, label, fields, prompt_token_ids=prompt_ids)
    else:
        turns = [
            ChatTurn(role="system" if m.role == "developer" else m.role, content=m.text())  # type: ignore[arg-type]
            for m in req.messages
        ]
        payload = _payload(rid, label, fields, chat=True, messages=turns)
    role = "assistant" if req.add_generation_prompt else req.messages[-1].role
    last = req.messages[-1]
    prefix = last.text() if req.echo and last.role == role else ""
    return Ask(req, [payload], tools, tok, role=role, echo_prefix=prefix)


def _payload(rid: str, prompt: str, fields: dict[str, Any], **more: Any) -> InferRequested:
    """The event, or a 400 naming the field the contract bounds (a prompt of more token ids
    than it carries, more messages than it takes)."""
    try:
        return InferRequested(request_id=rid, prompt=prompt, **fields, **more)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise BadRequest(
            f"{param}: {err['msg']} (a MinT limit of infer.requested)",
            param=param,
            code="limit_exceeded",
        ) from e


def _completion(
    req: CompletionRequest,
    ids: list[str],
    fields: dict[str, Any],
    tools: ToolOptions,
    tok: BaseTokenizer | None,
) -> Ask:
    prompts = req.prompts()
    if not prompts:
        raise BadRequest("prompt: the list is empty; send at least one prompt", param="prompt")
    payloads, texts = [], []
    for k, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise BadRequest("The decoder prompt cannot be empty", param="prompt")
            if req.add_special_tokens:
                payloads.append(_payload(ids[k], p, fields))
                texts.append(p)
                continue
            if tok is None:
                raise BadRequest(
                    "add_special_tokens=false needs the prompt tokenized on the gateway, and this "
                    "gateway does not have the model's base tokenizer; leave it out",
                    param="add_special_tokens",
                    code="unsupported_parameter",
                )
            token_ids, text = tok.encode(p, add_special_tokens=False), p
        else:
            if not p:
                raise BadRequest("The decoder prompt cannot be empty", param="prompt")
            token_ids = p
            text = tok.decode(p) if tok is not None else ""
            if req.echo and tok is None:
                raise BadRequest(
                    "echo of a prompt given as token ids needs the model's base tokenizer on the "
                    "gateway, which this gateway does not have; send the prompt as text",
                    param="echo",
                    code="unsupported_parameter",
                )
        if not token_ids:
            raise BadRequest("The decoder prompt cannot be empty", param="prompt")
        label = prompt_label(text) if text else f"<{len(token_ids)} tokens>"
        payloads.append(_payload(ids[k], label, fields, prompt_token_ids=token_ids))
        texts.append(text)
    echo_only = bool(req.echo) and req.max_tokens == 0
    return Ask(req, payloads, tools, tok, prompt_texts=texts, echo_only=echo_only)

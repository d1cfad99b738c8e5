"""``/tokenize`` and ``/detokenize`` as ``vllm serve`` 0.32 serves them, per tenant model
(gateway.tokenize): the key and the tenant's rate as the other routes, ``model`` the caller's
policy, the tokenizer its base model's."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway import asks
from gateway.api import parse_json, validate_body
from gateway.errors import BadRequest
from gateway.refs import parse_model
from gateway.requests import client_of, read_body
from gateway.service import Gateway
from gateway.tokenize import (
    BaseTokenizer,
    Detokenize,
    TokenizeChat,
    TokenizeCompletion,
    detokenize_answer,
    tokenize_answer,
)
from gateway.tools import tool_dicts

TRUST = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


def build_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    async def read(request: Request, detokenize: bool) -> tuple[Any, BaseTokenizer]:
        """(the body, the tokenizer of its model): the caller's key, its tenant's rate, the
        body, its policy's base model."""
        caller = await gw.authenticate(request.headers.get("authorization"), client_of(request))
        await gw.admit(caller.tenant)
        body = parse_json(await read_body(request, gw.config.max_body_bytes))
        model: type[Any] = TokenizeCompletion
        if detokenize:
            model = Detokenize
        elif "messages" in body:
            if body.get("continue_final_message") and body.get("add_generation_prompt", True):
                raise BadRequest(
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                )
            model = TokenizeChat
        req = validate_body(model, body)
        tok = await gw.tokenizer(parse_model(req.model, caller.tenant), req.model, required=True)
        assert tok is not None
        return req, tok

    @router.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        """A prompt, or messages through the chat template (as the chat route renders them)."""
        req, tok = await read(request, detokenize=False)
        if isinstance(req, TokenizeChat):
            kwargs = req.chat_template_kwargs or {}
            if req.chat_template is not None or kwargs.get("chat_template") is not None:
                raise BadRequest(TRUST)
            text = tok.render(
                asks.conversation(req.messages),
                tools=tool_dicts(req.tools),
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                kwargs=kwargs,
            )
            ids = tok.encode(text, add_special_tokens=req.add_special_tokens)
        else:
            ids = tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        return JSONResponse(tokenize_answer(tok, ids, bool(req.return_token_strs)))

    @router.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        """Token ids back to text."""
        req, tok = await read(request, detokenize=True)
        return JSONResponse(detokenize_answer(tok, req.tokens))

    return router

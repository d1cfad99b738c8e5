"""The ids the gateway gives a request, and how a caller's id maps back to them.

An HTTP request of ``n`` prompts gets the stem ``<instance id>.<24 hex>``: its engine request
ids are ``<stem>.<k>`` (prompt k: the instance prefix routes the answers back to this instance,
gateway.replies) and its response id is ``chatcmpl-<stem>`` / ``cmpl-<stem>`` (unless the caller
named it with ``request_id``, as ``vllm serve`` does). So a response id names its first request
on any instance, with nothing remembered: ``POST /v1/feedback`` takes either.

The sticky canary key (``InferRequested.caller``) is the OpenAI ``user`` when given, else the
API key: the same end user, or without one the same key, always gets the same side.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from gateway.errors import BadRequest
from schemas.events.inference import REQUEST_ID_RE

RESPONSE_PREFIXES = ("chatcmpl-", "cmpl-")
STEM_HEX = 24
MAX_CALLER = 256  # InferRequested.caller's bound
# a stem: an instance id (gateway.config.INSTANCE_ID_RE), a dot, the hex
_STEM = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_-]{{0,47}}\.[0-9a-f]{{{STEM_HEX}}}")


def request_ids(prefix: str, n: int) -> tuple[str, list[str]]:
    """(the response id's stem, one engine request id per prompt) under ``prefix`` (the
    instance's, ending in ``.``)."""
    stem = f"{prefix}{uuid.uuid4().hex[:STEM_HEX]}"
    return stem, [f"{stem}.{k}" for k in range(n)]


def request_id_of(given: str) -> str:
    """The engine request id that ``given`` names: a response id of this gateway (its first
    prompt's request) or an engine request id as is. A 400 naming ``id`` otherwise."""
    for prefix in RESPONSE_PREFIXES:
        if not given.startswith(prefix):
            continue
        stem = given.removeprefix(prefix)
        rid = f"{stem}.0"
        if _STEM.fullmatch(stem) and re.fullmatch(REQUEST_ID_RE, rid):
            return rid
        raise BadRequest(
            f"id {given[:80]!r} is a response id that names no request of this gateway (one "
            "named by the caller's request_id, or from an older gateway): send the engine "
            "request id instead, the x-mint-request-id header of that response",
            param="id",
        )
    if not re.fullmatch(REQUEST_ID_RE, given):
        raise BadRequest(
            f"id {given[:80]!r} is neither a response id (chatcmpl-… or cmpl-…) nor an engine "
            "request id (letters, digits, '.', '_', ':', '-'; at most 128): send the id of "
            "the answer you score",
            param="id",
        )
    return given


def sticky_caller(user: str | None, key_id: str) -> str:
    """The canary routing key: the OpenAI ``user`` (past the contract's bound, its digest),
    else the API key."""
    if not user:
        return f"key/{key_id}"
    raw = user.encode("utf-8", "surrogatepass")
    if len(user) <= MAX_CALLER and user.isprintable() and raw == user.encode("utf-8", "replace"):
        return user
    # too long, or not plain text (a lone surrogate would not encode): stable all the same
    return "sha256:" + hashlib.sha256(raw).hexdigest()

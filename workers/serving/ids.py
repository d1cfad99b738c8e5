"""Stable LoRA int ids derived from adapter digests.

vLLM names an adapter by an int id; reusing an id for other weights would serve stale weights
from its cache. Deriving the id from the content digest makes a new revision a new id, always,
and makes every engine agree on the id without coordination.
"""

from __future__ import annotations

import re

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_ID_SPACE = 2**31 - 1  # vLLM keeps ids in int32-sized slots; 0 means "no adapter"


def lora_int_id(digest: str) -> int:
    """``sha256:…`` → an int in [1, 2**31 - 1], the same on every host and process."""
    if not _DIGEST.match(digest):
        raise ValueError(
            f"digest {digest!r} is not 'sha256:' + 64 lowercase hex; pass the adapter's digest"
        )
    return int(digest[7:23], 16) % _ID_SPACE + 1


def lora_name(digest: str) -> str:
    """The adapter name vLLM shows (metrics, logs): short and content-derived."""
    return f"mint-{digest[7:19]}"

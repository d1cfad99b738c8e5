"""API keys of the gateway: the key format, and the salted hash that is all the catalog keeps.

A key reads ``mint_<key id>_<secret>``: the key id (12 lowercase hex digits) is the catalog's
lookup key and may appear in logs; the secret (43 URL-safe base64 characters, 256 random bits)
is shown once, when the key is made, and stored only as ``scrypt(secret, salt)`` with a random
per-key salt. ``kdf`` names the function and its parameters, so stronger settings can be rolled
out later while old keys still verify.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from catalog.exceptions import InvalidReference

KEY_PREFIX = "mint"
KEY_ID_RE = r"^[0-9a-f]{12}$"
_KEY = re.compile(r"^mint_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_KEY_ID = re.compile(KEY_ID_RE)
_KDF = re.compile(r"^scrypt\$n=(\d+)\$r=(\d+)\$p=(\d+)$")
# scrypt at the interactive-login setting (16 MiB, ~50 ms on one core here). The secrets are 256
# random bits, so the slow hash guards a leaked table rather than guessable passwords; the
# gateway verifies a key once and then caches the verdict (gateway/auth.py).
DEFAULT_KDF = "scrypt$n=16384$r=8$p=1"
SALT_BYTES = 16
HASH_BYTES = 32


class InvalidKey(InvalidReference):
    """A string that is not a MinT API key (``mint_<12 hex>_<43 url-safe characters>``)."""


@dataclass(frozen=True)
class NewKey:
    """A freshly made key: ``text`` is shown once; the rest is what the catalog stores."""

    key_id: str
    text: str
    kdf: str
    salt: bytes
    hash: bytes


def parse_key(text: str) -> tuple[str, str]:
    """``mint_<key id>_<secret>`` → (key id, secret); InvalidKey for anything else."""
    m = _KEY.match(text) if isinstance(text, str) else None
    if m is None:
        raise InvalidKey("not a MinT API key: expected mint_<12 hex digits>_<43 characters>")
    return m.group(1), m.group(2)


def check_key_id(key_id: object) -> str:
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise InvalidKey(f"key id {key_id!r} is not 12 lowercase hex digits (e.g. 3f9a0c1b2d4e)")
    return key_id


def hash_secret(secret: str, salt: bytes, kdf: str = DEFAULT_KDF) -> bytes:
    m = _KDF.match(kdf)
    if m is None:
        raise InvalidKey(f"unknown key derivation {kdf!r}: expected scrypt$n=N$r=R$p=P")
    n, r, p = (int(g) for g in m.groups())
    return hashlib.scrypt(
        secret.encode(), salt=salt, n=n, r=r, p=p, dklen=HASH_BYTES, maxmem=256 * n * r + 2**20
    )


def verify_secret(secret: str, salt: bytes, digest: bytes, kdf: str) -> bool:
    """Constant-time comparison of the secret's hash with the stored one."""
    return hmac.compare_digest(hash_secret(secret, salt, kdf), digest)


def new_key(kdf: str = DEFAULT_KDF) -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)  # 43 characters of [A-Za-z0-9_-]
    salt = secrets.token_bytes(SALT_BYTES)
    text = f"{KEY_PREFIX}_{key_id}_{secret}"
    return NewKey(key_id, text, kdf, salt, hash_secret(secret, salt, kdf))

"""API keys: format, salted scrypt hash, and the gateway's cache (revocation within the TTL,
scrypt once per key)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from catalog.apikeys import (
    DEFAULT_KDF,
    InvalidKey,
    check_key_id,
    hash_secret,
    new_key,
    parse_key,
    verify_secret,
)
from catalog.models import ApiKey
from gateway.auth import Authenticator, Caller, bearer
from gateway.errors import Unauthorized


def stored(key, tenant: str = "acme", revoked: bool = False) -> ApiKey:
    now = datetime.now(UTC)
    return ApiKey(
        key.key_id,
        tenant,
        "ci",
        key.kdf,
        key.salt,
        key.hash,
        now,
        "test",
        now if revoked else None,
        "test" if revoked else None,
    )


def test_a_new_key_parses_back_and_verifies_only_with_its_secret() -> None:
    key = new_key()
    key_id, secret = parse_key(key.text)
    assert key_id == key.key_id and key.text == f"mint_{key_id}_{secret}"
    assert check_key_id(key_id) == key_id and len(secret) == 43
    assert verify_secret(secret, key.salt, key.hash, key.kdf)
    assert not verify_secret(
        secret[:-1] + ("A" if secret[-1] != "A" else "B"), key.salt, key.hash, key.kdf
    )
    assert key.kdf == DEFAULT_KDF and len(key.salt) == 16 and len(key.hash) == 32
    assert secret.encode() not in key.hash and key.hash != secret.encode()


def test_salts_differ_so_equal_secrets_hash_differently() -> None:
    a, b = new_key(), new_key()
    assert a.salt != b.salt and a.key_id != b.key_id
    assert hash_secret("same", a.salt) != hash_secret("same", b.salt)
    assert hash_secret("same", a.salt) == hash_secret("same", a.salt)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "mint_",
        "sk-abcdef",
        "mint_0123456789ab",
        "mint_0123456789AB_" + "a" * 43,  # key id must be lowercase hex
        "mint_0123456789ab_" + "a" * 42,
        "mint_0123456789ab_" + "a" * 44,
        "mint_0123456789ab_" + "a" * 42 + "!",
        "xmint_0123456789ab_" + "a" * 43,
        None,
    ],
)
def test_malformed_keys_are_refused(text) -> None:
    with pytest.raises(InvalidKey, match="not a MinT API key"):
        parse_key(text)


def test_unknown_kdf_is_refused() -> None:
    with pytest.raises(InvalidKey, match="unknown key derivation"):
        hash_secret("x", b"salt", "md5")


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic abc", "token"])
def test_missing_bearer_is_unauthorized(header) -> None:
    with pytest.raises(Unauthorized, match="No API key"):
        bearer(header)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_authenticator_caches_rows_for_the_ttl_and_runs_scrypt_once() -> None:
    key = new_key()
    rows = {key.key_id: stored(key)}
    reads = []

    def lookup(key_id: str):
        reads.append(key_id)
        return rows.get(key_id)

    clock = Clock()
    auth = Authenticator(lookup, ttl_s=5.0, clock=clock)
    header = f"Bearer {key.text}"
    assert auth.authenticate(header, blocking=False) is None  # needs the catalog
    assert auth.authenticate(header) == Caller("acme", key.key_id)
    assert auth.authenticate(header, blocking=False) == Caller("acme", key.key_id)  # warm
    assert reads == [key.key_id] and auth.verifications == 1
    clock.now += 6  # the row expired: read again, but no second scrypt for the same row
    assert auth.authenticate(header) == Caller("acme", key.key_id)
    assert reads == [key.key_id] * 2 and auth.verifications == 1

    rows[key.key_id] = stored(key, revoked=True)  # revoked in the catalog
    assert auth.authenticate(header, blocking=False) == Caller("acme", key.key_id)  # cached
    clock.now += 6
    with pytest.raises(Unauthorized):
        auth.authenticate(header)


def test_wrong_secret_unknown_and_malformed_keys_are_401_and_remembered() -> None:
    key = new_key()
    reads = []

    def lookup(key_id: str):
        reads.append(key_id)
        return stored(key) if key_id == key.key_id else None

    auth = Authenticator(lookup, ttl_s=5.0, clock=Clock())
    wrong = key.text[:-1] + ("A" if key.text[-1] != "A" else "B")
    for _ in range(3):
        with pytest.raises(Unauthorized):
            auth.authenticate(f"Bearer {wrong}")
    assert auth.verifications == 1  # the failed verdict is cached too
    other = new_key()
    for _ in range(3):
        with pytest.raises(Unauthorized):
            auth.authenticate(f"Bearer {other.text}")
    assert reads == [key.key_id, other.key_id]  # unknown ids are remembered for the TTL
    with pytest.raises(Unauthorized):
        auth.authenticate("Bearer sk-not-ours")
    assert len(reads) == 2  # malformed keys never reach the catalog

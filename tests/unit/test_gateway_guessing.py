"""Guessing API keys costs the guesser, not the gateway (issue 25, defect 9): failed checks are
throttled per key id and per client address before scrypt or a catalog read, scrypt runs on its
own threads, and unknown key ids cost the same scrypt as known ones."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from catalog.apikeys import new_key
from catalog.models import ApiKey
from gateway import GatewayConfig, create_app
from gateway.auth import Authenticator, Budget, Caller
from gateway.errors import RateLimited, Unauthorized
from gateway.service import Gateway
from tests.unit.test_gateway_app import FakeCatalog, FakeEngines


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stored(key, revoked: bool = False) -> ApiKey:
    now = datetime.now(UTC)
    return ApiKey(
        key.key_id,
        "acme",
        "ci",
        key.kdf,
        key.salt,
        key.hash,
        now,
        "test",
        now if revoked else None,
        None,
    )


def wrong(key_id: str, i: int) -> str:
    """An Authorization header with a well-formed key of ``key_id`` and the i-th wrong secret."""
    return f"Bearer mint_{key_id}_{f'{i:043d}'}"


@pytest.fixture
def scrypt_runs(monkeypatch) -> list[str]:
    """The thread name of every scrypt run (the real one still runs)."""
    import gateway.auth as auth_module

    runs: list[str] = []
    real = auth_module.verify_secret

    def counting(*args):
        runs.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(auth_module, "verify_secret", counting)
    return runs


KEY_BUDGET, CLIENT_BUDGET = Budget(3, 0.5), Budget(100, 1.0)


def world(per_key: Budget = KEY_BUDGET, per_client: Budget = CLIENT_BUDGET):
    key = new_key()
    rows = {key.key_id: stored(key)}
    reads: list[str] = []

    def lookup(key_id: str):
        reads.append(key_id)
        return rows.get(key_id)

    clock = Clock()
    auth = Authenticator(lookup, ttl_s=5.0, clock=clock, per_key=per_key, per_client=per_client)
    return key, rows, reads, clock, auth


def test_wrong_secrets_for_one_key_id_run_scrypt_at_most_the_budget(scrypt_runs) -> None:
    key, _, _, clock, auth = world(per_key=Budget(3, 0.5))
    outcomes = []
    for i in range(20):
        try:
            auth.authenticate(wrong(key.key_id, i), client="10.0.0.1")
        except (Unauthorized, RateLimited) as e:
            outcomes.append(e)
    assert len(scrypt_runs) == 3  # the budget, not 20
    assert [type(e) for e in outcomes] == [Unauthorized] * 3 + [RateLimited] * 17
    limited = outcomes[-1]
    assert limited.status == 429 and limited.body()["error"]["code"] == "rate_limit_exceeded"
    assert limited.headers["Retry-After"] == "2" and key.key_id in limited.message
    clock.now += 2.0  # one token back (0.5/s): one more check, then limited again
    with pytest.raises(Unauthorized):
        auth.authenticate(wrong(key.key_id, 100), client="10.0.0.2")
    with pytest.raises(RateLimited):
        auth.authenticate(wrong(key.key_id, 101), client="10.0.0.3")
    assert len(scrypt_runs) == 4


def test_the_owner_of_an_attacked_key_id_keeps_working(scrypt_runs) -> None:
    key, _, _, clock, auth = world(per_key=Budget(2, 0.01))
    assert auth.authenticate(f"Bearer {key.text}", client="owner") == Caller("acme", key.key_id)
    for i in range(10):  # the guesser exhausts the key id's budget
        with pytest.raises((Unauthorized, RateLimited)):
            auth.authenticate(wrong(key.key_id, i), client="guesser")
    clock.now += 6  # the row expired: read again; the verdict is remembered, no token needed
    assert auth.authenticate(f"Bearer {key.text}", client="owner") == Caller("acme", key.key_id)
    assert len(scrypt_runs) == 3  # the owner's once, the guesser's budget of 2


def test_a_success_gives_its_tokens_back() -> None:
    keys = [new_key() for _ in range(5)]
    rows = {k.key_id: stored(k) for k in keys}
    auth = Authenticator(rows.get, ttl_s=5.0, clock=Clock(), per_client=Budget(2, 0.01))
    for k in keys:  # five first checks from one address: none of them failed
        assert auth.authenticate(f"Bearer {k.text}", client="10.0.0.9").key_id == k.key_id


def test_one_address_guessing_many_key_ids_is_stopped_before_the_catalog(scrypt_runs) -> None:
    _, _, reads, _, auth = world(per_client=Budget(5, 0.1))
    limited = 0
    for i in range(50):
        header = f"Bearer mint_{i:012x}_{'a' * 43}"
        try:
            auth.authenticate(header, client="203.0.113.7")
        except RateLimited as e:
            limited += 1
            assert "203.0.113.7" in e.message
        except Unauthorized:
            pass
    assert len(reads) == 5 and len(scrypt_runs) == 5 and limited == 45
    # another address is not limited by this one's bucket
    with pytest.raises(Unauthorized):
        auth.authenticate(f"Bearer mint_{999:012x}_{'a' * 43}", client="198.51.100.1")


def test_unknown_key_ids_cost_what_known_ones_cost(scrypt_runs) -> None:
    """The timing oracle is closed by doing the same work: one catalog read and one scrypt of
    the default cost for an unknown id as for a known id with a wrong secret, and the same
    cached answer when the same text comes again."""
    key, rows, reads, _, auth = world(per_key=Budget(10, 1.0))
    revoked = new_key()
    rows[revoked.key_id] = stored(revoked, revoked=True)
    unknown = new_key()
    for header in (wrong(key.key_id, 1), f"Bearer {unknown.text}", f"Bearer {revoked.text}"):
        before = (len(reads), len(scrypt_runs))
        for _ in range(3):
            with pytest.raises(Unauthorized):
                auth.authenticate(header, client="10.0.0.1")
        assert (len(reads) - before[0], len(scrypt_runs) - before[1]) == (1, 1), header
    # unknown ids are remembered (a short TTL): no catalog read for each guess of the same id
    with pytest.raises(Unauthorized):
        auth.authenticate(f"Bearer mint_{unknown.key_id}_{'b' * 43}", client="10.0.0.1")
    assert reads.count(unknown.key_id) == 1


def test_scrypt_runs_on_its_own_threads_not_the_catalogs(scrypt_runs) -> None:
    key, _, _, _, auth = world()
    lookup = auth.lookup
    read_on: list[str] = []

    def recording(key_id: str):
        read_on.append(threading.current_thread().name)
        return lookup(key_id)

    auth.lookup = recording
    caller = asyncio.run(auth.authenticate_async(f"Bearer {key.text}", "10.0.0.1"))
    assert caller == Caller("acme", key.key_id)
    assert scrypt_runs and all(name.startswith("key-check") for name in scrypt_runs)
    assert read_on and not read_on[0].startswith("key-check")
    auth.close()


def test_guessing_through_http_gets_openais_429_with_retry_after() -> None:
    catalog = FakeCatalog()
    catalog.add_key("acme")
    key_id = next(iter(catalog.keys))
    config = GatewayConfig(instance_id="gw-test", key_failures_burst=2, key_failures_per_s=0.1)
    with TestClient(create_app(Gateway(config, catalog, FakeEngines()))) as http:
        statuses = []
        for i in range(5):
            r = http.get("/v1/models", headers={"Authorization": wrong(key_id, i)})
            statuses.append(r.status_code)
        assert statuses == [401, 401, 429, 429, 429]
        body = r.json()["error"]
        assert body["type"] == "requests" and body["code"] == "rate_limit_exceeded"
        assert int(r.headers["Retry-After"]) >= 1
        assert "mint_gateway_rate_limited_total 3.0" in http.get("/metrics").text


def test_more_checks_waiting_for_scrypt_than_the_bound_are_shed(monkeypatch) -> None:
    import gateway.auth as auth_module
    from gateway.errors import Unavailable

    release, started = threading.Event(), threading.Event()

    def slow(*args):
        started.set()
        release.wait(10)
        return False

    monkeypatch.setattr(auth_module, "verify_secret", slow)
    key = new_key()
    auth = Authenticator({key.key_id: stored(key)}.get, ttl_s=5.0, max_waiting=1)
    first = threading.Thread(
        target=lambda: pytest.raises(Unauthorized, auth.authenticate, wrong(key.key_id, 1))
    )
    first.start()
    assert started.wait(10)
    with pytest.raises(Unavailable) as e:  # a 503 at once, not a place in a long queue
        auth.authenticate(wrong(key.key_id, 2), client="10.0.0.1")
    assert e.value.status == 503 and e.value.headers["Retry-After"] == "1"
    release.set()
    first.join(10)
    auth.close()

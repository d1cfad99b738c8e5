"""One gateway instance without its HTTP layer: authenticate, admit (rate), find the model,
ask the engines, check their answers. The catalog and the engines come in through two small
interfaces, so unit tests drive it with fakes and ``gateway.main`` with Cassandra and Kafka.

Everything kept here is a cache or a per-instance bucket: an instance that dies loses nothing
another instance needs, and a new one starts cold and correct.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

from catalog.models import ApiKey, TenantAccess
from catalog.refs import Ref
from gateway import ids
from gateway.auth import Authenticator, Budget, Caller
from gateway.cache import MISSING, Cached
from gateway.config import GatewayConfig
from gateway.deltas import Answers
from gateway.directory import ModelEntry
from gateway.errors import BadRequest, ModelNotFound, RateLimited, Unauthorized
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import RateLimiter, retry_after
from gateway.responses import check_answers, no_answer
from gateway.tokenize import BaseTokenizer, NoTokenizer, Tokenizers
from gateway.tools import ToolOptions
from schemas.envelope import Envelope, make_event
from schemas.events import InferCompleted, InferFailed, InferRequested
from schemas.exceptions import EventValidationError

V = TypeVar("V")
NEGATIVE_TTL_S = 2.0  # a policy or digest created just now is found within this


class Catalog(Protocol):
    """Blocking catalog reads (gateway.directory.CatalogDirectory, or a fake)."""

    def key(self, key_id: str) -> ApiKey | None: ...
    def tenant(self, tenant: str) -> TenantAccess | None: ...
    def policy_exists(self, tenant: str, policy: str) -> bool: ...
    def revision_of_digest(self, tenant: str, policy: str, digest: str) -> int | None: ...
    def models(self, tenant: str) -> list[ModelEntry]: ...

    # Optional, read with getattr: ``base_model(tenant, policy) -> str | None``, the policy's
    # base model (its tokenizer serves /tokenize and templates rendered on the gateway); a
    # catalog without it gives the gateway no tokenizers.


class Engines(Protocol):
    """The engines behind Kafka (gateway.dispatch.KafkaEngines, or a fake)."""

    request_prefix: str  # every request id of this instance starts with it

    @property
    def healthy(self) -> bool: ...
    def start(self) -> None: ...
    def close(self) -> None: ...
    async def submit(
        self, envs: list[Envelope[InferRequested]], timeout_s: float
    ) -> list[Envelope[Any]]: ...
    async def open(self, envs: list[Envelope[InferRequested]], timeout_s: float) -> Answers: ...


class Attached(Protocol):
    """A surface started and closed with the gateway (gateway.tinker.service.TinkerApi): all
    the gateway needs of it, so this module never imports the Tinker API, which imports it."""

    def start(self) -> None: ...
    def close(self) -> None: ...


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        catalog: Catalog,
        engines: Engines,
        *,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.config, self.catalog, self.engines = config, catalog, engines
        self.metrics = metrics or GatewayMetrics()
        self.producer_name = f"gateway/{config.instance_id}"
        self.auth = Authenticator(
            catalog.key,
            config.key_ttl_s,
            clock=clock,
            threads=config.key_check_threads,
            per_key=Budget(config.key_failures_burst, config.key_failures_per_s),
            per_client=Budget(config.client_failures_burst, config.client_failures_per_s),
        )
        self.limiter = RateLimiter(clock=clock)
        ttl = config.catalog_ttl_s
        short = min(ttl, NEGATIVE_TTL_S)
        self._tenants = Cached(catalog.tenant, ttl, clock=clock)
        self._policies = Cached(
            lambda k: catalog.policy_exists(*k),
            ttl,
            clock=clock,
            ttl_of=lambda found: ttl if found else short,
        )
        # A digest names one revision forever; only "not found" may change.
        self._digests = Cached(
            lambda k: catalog.revision_of_digest(*k),
            24 * 3600.0,
            clock=clock,
            ttl_of=lambda rev: 24 * 3600.0 if rev else short,
        )
        self._models = Cached(catalog.models, ttl, clock=clock)
        read_base = getattr(catalog, "base_model", None)
        # a policy's base model never changes: only "not found" may
        self._base_models = (
            Cached(
                lambda k: read_base(*k),
                24 * 3600.0,
                clock=clock,
                ttl_of=lambda base: 24 * 3600.0 if base else short,
            )
            if read_base is not None
            else None
        )
        self._on_close = on_close
        # the Tinker API (gateway.tinker.service.TinkerApi), when served: gateway.app routes it
        self.tinker: Attached | None = None
        # vllm serve's --enable-auto-tool-choice / --tool-call-parser (gateway.tools)
        self.tools = ToolOptions(config.tool_call_parser, config.enable_auto_tool_choice)
        # the base models' tokenizers (gateway.tokenize), when this gateway has their folders
        self.tokenizers: Tokenizers | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.engines.start()
        if self.tinker is not None:
            self.tinker.start()

    def close(self) -> None:
        if self.tinker is not None:
            self.tinker.close()
        self.engines.close()
        self.auth.close()
        if self._on_close is not None:
            self._on_close()

    # ------------------------------------------------------------------ steps of a request

    async def _cached(self, cached: Cached[V], key: Hashable) -> V:
        value = cached.peek(key)
        if value is MISSING:  # a catalog read: off the event loop
            value = await asyncio.to_thread(cached.load, key)
        return value  # type: ignore[return-value]

    async def authenticate(self, header: str | None, client: str | None = None) -> Caller:
        """The caller of an Authorization header sent from ``client`` (its address: failed
        checks are throttled per address too)."""
        try:
            return await self.auth.authenticate_async(header, client)
        except Unauthorized:
            self.metrics.auth_failures.inc()
            raise
        except RateLimited:
            self.metrics.rate_limited.inc()
            raise

    async def admit(self, tenant: str) -> None:
        """Take a token of the tenant's bucket, or RateLimited with Retry-After."""
        access = await self._cached(self._tenants, tenant)
        rate = (access and access.rate_per_s) or self.config.rate_per_s
        burst = (access and access.burst) or self.config.burst
        wait = self.limiter.take(tenant, rate, burst)
        if wait is not None:
            self.metrics.rate_limited.inc()
            raise RateLimited(
                f"tenant {tenant} is over its rate of {rate:g} requests/s (burst {burst}) on "
                f"this gateway instance: retry after {wait:.1f} s",
                headers={"Retry-After": retry_after(wait)},
            )

    async def target(self, ref: Ref, model: str) -> tuple[str, int | None]:
        """(alias, revision) to ask the engines for; ModelNotFound when the caller's tenant has
        no such policy or digest (the engine says so for aliases and numbers that point
        nowhere)."""
        if not await self._cached(self._policies, (ref.tenant, ref.policy)):
            raise ModelNotFound(model)
        if ref.digest is not None:
            revision = await self._cached(self._digests, (ref.tenant, ref.policy, ref.digest))
            if revision is None:
                raise ModelNotFound(model)
            return "prod", revision
        return ref.alias or "prod", ref.revision

    async def models(self, tenant: str) -> list[ModelEntry]:
        return await self._cached(self._models, tenant)

    async def tokenizer(self, ref: Ref, model: str, *, required: bool) -> BaseTokenizer | None:
        """The tokenizer of the policy's base model (the caller's policy: ModelNotFound
        otherwise). Not on this gateway: None, or with ``required`` a 400 that says so."""
        if not await self._cached(self._policies, (ref.tenant, ref.policy)):
            raise ModelNotFound(model)
        why = "this gateway has no tokenizers (no base model folders)"
        if self.tokenizers is not None and self._base_models is not None:
            base = await self._cached(self._base_models, (ref.tenant, ref.policy))
            if base is None:
                raise ModelNotFound(model)
            try:
                return await self.tokenizers.get(base)
            except NoTokenizer as e:
                why = str(e)
        if required:
            raise BadRequest(f"model '{model}': {why}", param="model", code="tokenizer_unavailable")
        return None

    def request_ids(self, n: int) -> tuple[str, list[str]]:
        """(the response id's stem, one request id per prompt) under this instance's prefix:
        the response id names its requests (gateway.ids)."""
        return ids.request_ids(self.engines.request_prefix, n)

    def _envelopes(
        self, ref: Ref, payloads: list[InferRequested], correlation_id: uuid.UUID
    ) -> list[Envelope[InferRequested]]:
        try:
            return [
                make_event(
                    p,
                    tenant=ref.tenant,
                    policy=ref.policy,
                    producer=self.producer_name,
                    correlation_id=correlation_id,
                )
                for p in payloads
            ]
        except EventValidationError as e:
            raise BadRequest(str(e)) from e

    def count_tokens(self, done: list[InferCompleted]) -> None:
        """Count the tokens of answered requests (a stream counts its own when it ends)."""
        self.metrics.tokens.labels("prompt").inc(sum(p.prompt_tokens for p in done))
        self.metrics.tokens.labels("completion").inc(sum(p.completion_tokens for p in done))

    def streamed(self, done: list[InferCompleted], started: float) -> None:
        """A stream's answers are all in (``started``: its ``time.perf_counter()`` at publish)."""
        self.count_tokens(done)
        self.metrics.engine_seconds.observe(time.perf_counter() - started)

    async def run(
        self, ref: Ref, model: str, payloads: list[InferRequested], correlation_id: uuid.UUID
    ) -> list[InferCompleted]:
        """Ask the engines (one request per prompt, one correlation id) and return the answers
        in order, or the error of the first failed one."""
        envs = self._envelopes(ref, payloads, correlation_id)
        answers = await self.engines.submit(envs, self.config.answer_timeout_s)
        done = check_answers(
            answers,
            model,
            self.config.retry_after_s,
            prompt_param="messages" if payloads[0].chat else "prompt",
        )
        self.count_tokens(done)
        return done

    async def stream(
        self, ref: Ref, model: str, payloads: list[InferRequested], correlation_id: uuid.UUID
    ) -> tuple[Answers, list[tuple[int, Envelope[Any]]]]:
        """Ask the engines for streamed answers and wait until each request is heard from (a
        delta, or its answer): the events read so far come back with the open answers, whose
        caller must close them. A request refused then (a prompt past the context, a policy
        that does not resolve) is its error here, before any byte of a stream is sent: engines
        refuse at admission, before they generate. Unavailable at the answer timeout."""
        envs = self._envelopes(ref, payloads, correlation_id)
        answers = await self.engines.open(envs, self.config.answer_timeout_s)
        try:
            first = await answers.first()
            check_answers(
                [env for _, env in first if isinstance(env.payload, InferFailed)],
                model,
                self.config.retry_after_s,
                prompt_param="messages" if payloads[0].chat else "prompt",
            )
        except TimeoutError:
            answers.close()
            self.metrics.timeouts.inc()
            raise no_answer(answers.timeout_s, self.config.retry_after_s) from None
        except BaseException:
            answers.close()
            raise
        return answers, first

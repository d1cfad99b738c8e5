"""The MinT client: every verb is an event on Kafka, every answer is the event it caused.

    with MintClient(settings, tenant="acme") as mint:
        mint.create_policy("math-rl", base_model=..., suite="toy-even",
                           thresholds={"reward": {"min": 0.6}})
        for r in mint.train("math-rl", prompts, rounds=4, reward="even_tokens"):
            print(r.round, r.revision, r.mean_reward)
        mint.wait_for_alias("math-rl", "prod")
        print(mint.infer("math-rl", "hello").text)
        mint.promote("math-rl", 7, canary=0.1)  # 10% of prod's callers, judged live
        mint.rollback("math-rl")
        mint.tag("math-rl", 7, add=["reviewed"])  # the revision's tags now
        mint.retire("math-rl", reason="superseded")  # through the controller

A call publishes its command and waits for the event whose ``causation_id`` is the command's id
(the watcher was positioned at the topics' end before publishing, so no answer is missed).
Catalog reads (revisions, aliases, history) go to Cassandra directly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Unpack

import structlog

from catalog.store import AdapterStore
from mint.sdk.exceptions import RequestFailed
from mint.sdk.registry import RegistryVerbs
from mint.sdk.sampling import SamplingFields, sampling_options
from mint.sdk.serving import ServingVerbs
from mint.sdk.training import TrainingVerbs
from mint.sdk.watcher import Predicate, Watcher, caused_by
from schemas import Envelope, make_event
from schemas.events import (
    AliasMoved,
    CanaryRule,
    InferCompleted,
    InferRequested,
    PolicyConfigured,
    Threshold,
)
from schemas.events.sampling import SamplingOptions
from schemas.settings import MintSettings
from streams.producer import EventProducer
from streams.topics import ensure_topics

if TYPE_CHECKING:
    from mint.sdk.remote import RemoteMintClient

log = structlog.get_logger()


class MintClient(TrainingVerbs, ServingVerbs, RegistryVerbs):
    def __init__(
        self,
        settings: MintSettings,
        tenant: str,
        *,
        producer: str = "sdk",
        timeout_s: float = 300.0,
    ) -> None:
        self.settings, self.tenant, self.name, self.timeout_s = (
            settings,
            tenant,
            producer,
            timeout_s,
        )
        ensure_topics(settings)
        self.store = AdapterStore.from_settings(settings)
        self.watcher = Watcher(settings)
        self.producer = EventProducer(settings, client_id=f"mint-{producer}")
        self._catalog: Any = None
        self._cluster: Any = None
        self.base_models: dict[str, str] = {}

    @staticmethod
    def remote(base_url: str, api_key: str, **kw: Any) -> RemoteMintClient:
        """A tenant's client over HTTP: the gateway's URL and an API key, no Kafka or Cassandra
        credentials (mint.sdk.remote: policies, revisions, aliases, promote, rollback, configure,
        infer; training over HTTP is the Tinker API). This class is the operators' direct mode."""
        from mint.sdk.remote import RemoteMintClient

        return RemoteMintClient(base_url, api_key, **kw)

    # ------------------------------------------------------------------ plumbing

    def send(self, policy: str, payload: Any, caused_by_env: Envelope[Any] | None = None):
        env = make_event(
            payload, tenant=self.tenant, policy=policy, producer=self.name, caused_by=caused_by_env
        )
        self.producer.publish(env)
        return env

    def wait_for(
        self,
        predicate: Predicate,
        *,
        timeout_s: float | None = None,
        what: str = "event",
        request: Envelope[Any] | None = None,
    ) -> Envelope[Any]:
        """The first event (seen since this client started) that matches ``predicate``; fails
        fast when ``request`` was dead-lettered."""
        return self.watcher.wait_for(
            predicate,
            timeout_s or self.timeout_s,
            what,
            request.event_id if request is not None else None,
        )

    def wait_caused_by(self, cmd: Envelope[Any], *types: str, timeout_s: float | None = None):
        return self.wait_for(
            caused_by(cmd.event_id, *types),
            timeout_s=timeout_s,
            request=cmd,
            what=f"{'/'.join(types) or 'answer'} to {cmd.type} {cmd.event_id}",
        )

    @property
    def catalog(self):
        if self._catalog is None:
            from catalog.cluster import connect
            from catalog.repository import CatalogRepository

            self._cluster, session = connect(self.settings)
            self._catalog = CatalogRepository(session, self.settings.keyspace)
        return self._catalog

    def close(self) -> None:
        self.watcher.close()
        self.producer.close()
        if self._cluster is not None:
            self._cluster.shutdown()

    def __enter__(self) -> MintClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ lifecycle verbs

    def create_policy(
        self,
        policy: str,
        *,
        base_model: str,
        suite: str,
        thresholds: dict[str, Threshold | dict] | None = None,
        promote_to: str = "prod",
        auto_evaluate: bool = True,
        auto_promote: bool = True,
        rollback_metric: str | None = None,
        rollback_tolerance: float = 0.0,
        canary: CanaryRule | dict[str, Any] | None = None,
    ) -> Envelope[Any]:
        """Configure a policy's lifecycle (the controller's gate, rollback rule and ``canary``
        rule: when a canary wins, see ``promote(..., canary=share)``; None: CanaryRule's
        defaults). The policy's catalog row appears with its first revision."""
        self.base_models[policy] = base_model
        cfg = PolicyConfigured(
            base_model=base_model,
            suite=suite,
            thresholds={k: Threshold.model_validate(v) for k, v in (thresholds or {}).items()},
            promote_to=promote_to,
            auto_evaluate=auto_evaluate,
            auto_promote=auto_promote,
            rollback_metric=rollback_metric,
            rollback_tolerance=rollback_tolerance,
            canary=CanaryRule.model_validate(canary or {}),
            requested_by=self.name,
        )
        return self.send(policy, cfg)

    def _base(self, policy: str, base_model: str | None) -> str:
        model = base_model or self.base_models.get(policy) or self.settings.base_model
        if not model:
            raise ValueError(
                f"no base_model for policy {policy!r}: pass base_model=… or call "
                "create_policy first"
            )
        return model

    def infer(
        self,
        policy: str,
        prompt: str,
        *,
        alias: str = "prod",
        revision: int | None = None,
        max_tokens: int = 8,
        temperature: float = 0.0,
        request_id: str | None = None,
        chat: bool = False,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
        sampling: SamplingOptions | dict[str, Any] | None = None,
        **options: Unpack[SamplingFields],
    ) -> InferCompleted:
        """Answer a prompt with ``policy@alias`` (or a pinned revision): the infer.completed
        payload; raises RequestFailed on infer.failed. ``chat`` sends the prompt as a user turn
        of the model's chat template (instruct models).

        vLLM's other settings are keywords (mint.sdk.sampling: ``top_k``, ``min_p``,
        ``repetition_penalty``, ``stop_token_ids``, ``top_logprobs``, …) or ``sampling=``; and
        ``json_schema=`` / ``json_object=True`` / ``regex=`` / ``choice=`` / ``grammar=``
        constrain the answer's text::

            r = mint.infer("extract", "Alice is 31.", chat=True, max_tokens=64,
                           json_schema={"type": "object", "required": ["name", "age"],
                                        "properties": {"name": {"type": "string"},
                                                       "age": {"type": "integer"}}})
            json.loads(r.text)  # {"name": "Alice", "age": 31}

        ``logprobs`` returns each sampled token's log-probability (``r.logprobs``);
        ``top_logprobs=k`` also returns each token's string, bytes and ``k`` alternatives
        (``r.token_logprobs``; it implies ``logprobs``), and ``r.stop_reason`` says which stop
        string or token id ended the answer. A bad setting raises InvalidSampling before
        anything is sent."""
        opts = sampling_options(sampling, **options)
        rid = request_id or uuid.uuid4().hex
        cmd = self.send(
            policy,
            InferRequested(
                request_id=rid,
                alias=alias,
                revision=revision,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                chat=chat,
                top_p=top_p,
                seed=seed,
                stop=list(stop),
                logprobs=logprobs or (opts is not None and opts.top_logprobs is not None),
                sampling=opts,
            ),
        )
        got = self.wait_for(
            lambda e: (
                e.type in ("infer.completed", "infer.failed")
                and e.policy_id == cmd.policy_id
                and e.payload.request_id == rid
            ),
            what=f"result of request {rid}",
            request=cmd,
        )
        if got.type == "infer.failed":
            p = got.payload
            code = f" ({p.code})" if getattr(p, "code", None) else ""
            raise RequestFailed(f"request {rid} failed at {p.stage}{code}: {p.error}")
        return got.payload

    def wait_for_alias(
        self,
        policy: str,
        alias: str = "prod",
        revision: int | None = None,
        timeout_s: float | None = None,
    ) -> Envelope[AliasMoved]:
        """The next alias.moved of ``policy@alias`` (to ``revision``, if given)."""
        pid = f"{self.tenant}/{policy}"
        return self.wait_for(
            lambda e: (
                e.type == "alias.moved"
                and e.policy_id == pid
                and e.payload.alias == alias
                and (revision is None or e.payload.to_revision == revision)
            ),
            timeout_s=timeout_s,
            what=f"alias.moved of {pid}@{alias}",
        )

    # ------------------------------------------------------------------ catalog reads

    def latest_revision(self, policy: str) -> int | None:
        from catalog.exceptions import NotFound

        try:
            rows, _ = self.catalog.list_revisions(self.tenant, policy, page_size=1)
        except NotFound:
            return None
        return rows[0].revision if rows else None

    def revisions(self, policy: str) -> list[Any]:
        """The policy's revisions, newest first; each carries ``training`` (the figures its
        training measured: steps, tokens, loss, reward, learning_rate; {} when unknown)."""
        return list(self.catalog.iter_revisions(self.tenant, policy))

    def revision(self, policy: str, revision: int) -> Any:
        """One revision (``catalog.models.Revision``, with its ``training`` figures)."""
        return self.catalog.get_revision(self.tenant, policy, revision)

    def evaluations(self, policy: str, revision: int | None = None) -> list[Any]:
        """The latest evaluation result per (revision, suite) of the policy, or of one
        revision (``catalog.models.Evaluation``: metrics, thresholds, passed, failures,
        refused, evaluated_at)."""
        return self.catalog.evaluations(self.tenant, policy, revision)

    def evaluations_by_revision(self, policy: str) -> dict[int, list[Any]]:
        """``evaluations`` of the policy grouped by revision number."""
        return self.catalog.evaluations_by_revision(self.tenant, policy)

    def aliases(self, policy: str) -> list[Any]:
        return self.catalog.list_aliases(self.tenant, policy)

    def history(self, policy: str, alias: str = "prod", limit: int = 100) -> list[Any]:
        """The alias's moves (catalog history rows), newest first."""
        return self.catalog.alias_history(self.tenant, policy, alias, limit=limit)

    def policies(self) -> list[Any]:
        return self.catalog.list_policies(self.tenant)

    def policy(self, policy: str) -> Any:
        """One policy (``catalog.models.Policy``: base model, created, retired_at/retired_by)."""
        return self.catalog.get_policy(self.tenant, policy)

    def events(self, policy: str | None = None, types: Iterable[str] = ()) -> list[Envelope[Any]]:
        """Events this client has seen (since it started), optionally of one policy/types."""
        types = set(types)
        pid = f"{self.tenant}/{policy}" if policy else None
        return [
            e
            for e in self.watcher.events()
            if (pid is None or e.policy_id == pid) and (not types or e.type in types)
        ]

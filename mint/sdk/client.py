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

The verbs both clients share (promote, rollback, canary_status, tag, retire, feedback, infer,
policies, revisions, aliases, latest_revision) are mint.sdk.verbs', over the direct transport
(mint.sdk.transport): a call publishes its command and waits for the event whose
``causation_id`` is the command's id (the watcher was positioned at the topics' end before
publishing, so no answer is missed), and reads go to Cassandra. Direct only: create_policy,
the training verbs (mint.sdk.training), wait_for/wait_for_alias, events, history, evaluations,
revision and policy; the HTTP client's own is ``configure``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog

from catalog.store import AdapterStore
from mint.sdk.exceptions import WaitTimeout
from mint.sdk.training import TrainingVerbs
from mint.sdk.transport import DirectTransport
from mint.sdk.verbs import Verbs
from mint.sdk.watcher import Predicate, Watcher, caused_by
from schemas import Envelope, make_event
from schemas.events import AliasMoved, CanaryRule, PolicyConfigured, Threshold
from schemas.settings import MintSettings
from streams.producer import EventProducer
from streams.topics import ensure_topics

if TYPE_CHECKING:
    from mint.sdk.remote import RemoteMintClient

log = structlog.get_logger()


class MintClient(TrainingVerbs, Verbs):
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

    @property
    def transport(self) -> DirectTransport:
        return DirectTransport(self)  # stateless: the client's producer, watcher and catalog

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

    # ------------------------------------------------------------------ direct only

    def retire(
        self, policy: str, reason: str = "", undo: bool = False, *, timeout_s: float | None = None
    ) -> Any:
        """Verbs.retire, then the policy's catalog row once the projector recorded the fact
        (``retired_at``, ``retired_by``). PolicyNotFound: nothing sent; WaitTimeout also when
        no projector runs (the controller may not write the policies table)."""
        self.catalog.get_policy(self.tenant, policy)  # PolicyNotFound: nothing sent
        fact = super().retire(policy, reason, undo, timeout_s=timeout_s)
        wait = timeout_s if timeout_s is not None else self.timeout_s
        deadline = time.monotonic() + wait
        while not self.catalog.is_applied(fact.event_id):
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"policy.retired {fact.event_id} of {fact.policy_id} was not recorded in the "
                    f"catalog within {wait:g}s: is `mint worker projector` running?"
                )
            time.sleep(0.1)
        return self.catalog.get_policy(self.tenant, policy)

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

    def history(self, policy: str, alias: str = "prod", limit: int = 100) -> list[Any]:
        """The alias's moves (catalog history rows), newest first."""
        return self.catalog.alias_history(self.tenant, policy, alias, limit=limit)

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

"""How a verb's request reaches MinT and its answer comes back (mint.sdk.verbs writes the verbs
once over this). Two transports:

- ``DirectTransport`` (operators, ``MintClient(settings, tenant)``): the command is an event on
  Kafka and the answer is the event it caused (the client's watcher); reads go to Cassandra.
- ``HttpTransport`` (tenants, ``MintClient.remote(url, api_key)``; mint.sdk.remote): the
  gateway's ``/mint/v1`` and OpenAI routes with an API key, which publish the same commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from mint.sdk.exceptions import CommandRefused, RequestFailed
from mint.sdk.watcher import answering
from schemas import Envelope
from schemas.envelope import Command
from schemas.events import InferCompleted, InferRequested

if TYPE_CHECKING:
    from workers.controller.canary_view import CanaryView


class Transport(Protocol):
    name: str  # who asks (requested_by); the gateway puts the API key's id instead

    def command(
        self,
        policy: str,
        cmd: Command,
        answers: tuple[str, ...],
        where: str,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """Deliver a controller command; its answer (``answer.payload`` has the fact's fields),
        or CommandRefused naming ``{cmd type} of {policy}{where}``; WaitTimeout: none in time."""
        ...

    def publish(self, policy: str, payload: Command) -> Any:
        """Deliver an event nobody answers (feedback)."""
        ...

    def infer(self, policy: str, request: InferRequested) -> Any: ...

    def policies(self) -> list[Any]: ...

    def revisions(self, policy: str, limit: int | None) -> list[Any]: ...

    def aliases(self, policy: str) -> list[Any]: ...

    def canary_view(self, policy: str) -> CanaryView | None: ...


class DirectTransport:
    """Kafka and Cassandra through a MintClient's plumbing (``send``, ``wait_for``, ``catalog``,
    ``tenant``, ``name``): anything with those parts works (tests pass fakes)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    @property
    def name(self) -> str:
        return self.client.name

    def command(self, policy, cmd, answers, where, *, timeout_s=None) -> Envelope[Any]:
        env = self.client.send(policy, cmd)
        answer = self.client.wait_for(
            answering(env, *answers, "serving.refused"),
            timeout_s=timeout_s,
            request=env,
            what=f"{'/'.join(answers)} or serving.refused to {env.type} {env.event_id} (from "
            "the controller: `mint worker controller`)",
        )
        if answer.type == "serving.refused":
            p = answer.payload
            raise CommandRefused(
                f"{env.type} of {env.policy_id}{where} refused: {p.reason}",
                current_revision=p.current_revision,
            )
        return answer

    def publish(self, policy: str, payload: Command) -> Envelope[Any]:
        return self.client.send(policy, payload)

    def infer(self, policy: str, request: InferRequested) -> InferCompleted:
        cmd = self.client.send(policy, request)
        rid = request.request_id
        got = self.client.wait_for(
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

    def policies(self) -> list[Any]:
        return self.client.catalog.list_policies(self.client.tenant)

    def revisions(self, policy: str, limit: int | None) -> list[Any]:
        cat, tenant = self.client.catalog, self.client.tenant
        if limit is None:
            return list(cat.iter_revisions(tenant, policy))
        rows, _ = cat.list_revisions(tenant, policy, page_size=limit)
        return list(rows[:limit])

    def aliases(self, policy: str) -> list[Any]:
        return self.client.catalog.list_aliases(self.client.tenant, policy)

    def canary_view(self, policy: str) -> CanaryView | None:
        from workers.controller.canary_view import read_canary_view

        cat = self.client.catalog
        return read_canary_view(cat.session, cat.keyspace, self.client.tenant, policy)

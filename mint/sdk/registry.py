"""The SDK's registry verbs (tag a revision, retire a policy): each publishes its command on
``serving.commands`` and waits for the controller's answer, like every MintClient verb.

    mint.tag("math-rl", 7, add=["candidate"])        # ['candidate']: the revision's tags now
    mint.tag("math-rl", 7, add=["reviewed"], remove=["candidate"])
    mint.revision("math-rl", 7).tags                  # ['reviewed']
    mint.retire("math-rl", reason="superseded")       # the policy, retired_at/retired_by set

The controller checks the command against the catalog, writes it, then publishes the fact
(``revision.tagged``, ``policy.retired``) as the command's reply, so once the reply arrives the
catalog reads the new state; a command it cannot carry out (no such revision or policy) is
answered by ``serving.refused``, raised here as CommandRefused with the controller's reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from mint.sdk.exceptions import CommandRefused, WaitTimeout
from mint.sdk.serving import _build
from mint.sdk.watcher import answering
from schemas import Envelope
from schemas.events import RetireCommand, TagCommand


class RegistryVerbs:
    """Mixed into MintClient: uses its send, wait_for, catalog, tenant and name."""

    def tag(
        self,
        policy: str,
        revision: int,
        add: Iterable[str] = (),
        remove: Iterable[str] = (),
        *,
        timeout_s: float | None = None,
    ) -> list[str]:
        """Add ``add`` to revision ``revision``'s tags and take ``remove`` off (labels such as
        "candidate", "reviewed", "release-2026-12": letters, digits, '.', '_', '-'; at most 64
        characters). Returns the revision's tags afterwards, sorted (the ``revision.tagged``
        fact carries the whole set). A bad tag, or nothing to do, raises EventValidationError
        before anything is sent; a revision the catalog lacks raises CommandRefused."""
        add, remove = list(dict.fromkeys(add)), list(dict.fromkeys(remove))
        cmd = self.send(
            policy,
            _build(
                TagCommand,
                "revision.tag",
                revision=revision,
                add=add,
                remove=remove,
                requested_by=self.name,
            ),
        )
        answer = self._registry_answer(
            cmd, "revision.tagged", f"{cmd.policy_id}@{revision}", timeout_s
        )
        return list(answer.payload.tags)

    def retire(
        self,
        policy: str,
        reason: str = "",
        undo: bool = False,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """Retire ``policy`` (``undo``: restore it): no new revision or alias move while
        retired, its revisions and aliases stay readable. Publishes ``policy.retire``, which
        the controller (`mint worker controller`) answers with ``policy.retired``, and returns
        the policy once the projector recorded it (``retired_at``, ``retired_by``). PolicyNotFound: nothing sent;
        CommandRefused: the controller's reason; WaitTimeout: it applies when the controller
        runs (the command stays on serving.commands)."""
        self.catalog.get_policy(self.tenant, policy)  # PolicyNotFound: nothing sent
        cmd = self.send(
            policy,
            _build(
                RetireCommand,
                "policy.retire",
                retired=not undo,
                reason=reason,
                requested_by=self.name,
            ),
        )
        fact = self._registry_answer(cmd, "policy.retired", cmd.policy_id, timeout_s)
        # The projector records the fact (the controller may not write the policies table).
        wait = timeout_s if timeout_s is not None else self.timeout_s
        deadline = time.monotonic() + wait
        while not self.catalog.is_applied(fact.event_id):
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"policy.retired {fact.event_id} of {cmd.policy_id} was not recorded in the "
                    f"catalog within {wait:g}s: is `mint worker projector` running?"
                )
            time.sleep(0.1)
        return self.catalog.get_policy(self.tenant, policy)

    def _registry_answer(
        self, cmd: Envelope[Any], fact: str, what: str, timeout_s: float | None
    ) -> Envelope[Any]:
        """The controller's reply to ``cmd``: ``fact``, or CommandRefused on serving.refused."""
        answer = self.wait_for(
            answering(cmd, fact, "serving.refused"),
            timeout_s=timeout_s,
            request=cmd,
            what=f"{fact} or serving.refused to {cmd.type} {cmd.event_id} (from the "
            "controller: `mint worker controller`)",
        )
        if answer.type == "serving.refused":
            raise CommandRefused(f"{cmd.type} of {what} refused: {answer.payload.reason}")
        return answer

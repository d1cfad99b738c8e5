"""MintClient over HTTP: a tenant's lifecycle verbs with its API key alone (no Kafka, no
Cassandra credentials), through the gateway's ``/mint/v1`` and OpenAI endpoints.

    with MintClient.remote("https://mint.example.com", api_key="mint_…") as mint:
        print([p.policy for p in mint.policies()])
        print([r.revision for r in mint.revisions("math-rl")])
        mint.promote("math-rl", 7)                 # through the controller, like an operator's
        answer = mint.infer("math-rl", "2+2=")     # /v1/completions on math-rl@prod
        print(answer.text)
        mint.promote("math-rl", 8, canary=0.1)     # a tenth of prod's callers get 8
        mint.feedback("math-rl", answer.id, 0.9)   # an online score of that answer
        mint.rollback("math-rl")                   # ends a running canary (else moves back)
        mint.tag("math-rl", 7, add=["reviewed"])   # the revision's tags afterwards

The verbs keep the direct client's names and arguments; the tenant is the key's. A promote or
rollback is a serving command the controller carries out (compare-and-set on the alias); a
refusal raises CommandRefused with the alias's ``current_revision``, no answer in time raises
WaitTimeout (the command stays queued: check ``aliases()`` before sending it again).

Training over HTTP is the Tinker API that the same gateway serves under ``/api/v1`` (README,
"Train your own task"): the official ``tinker`` SDK with ``TINKER_API_KEY=tml-<MinT key>``.
``configure`` sets a policy's lifecycle (suite, gate, rollback rule) like the direct client's
``create_policy``, on the base model the catalog has for the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Unpack

import httpx

from mint.sdk.exceptions import CommandRefused, MintError, WaitTimeout
from mint.sdk.remote_types import (
    AliasInfo,
    CanaryInfo,
    Completion,
    Moved,
    PolicyInfo,
    Retirement,
    RevisionInfo,
    choice_logprobs,
    iso_time,
)
from mint.sdk.sampling import SamplingFields, openai_fields, sampling_options
from schemas.events.sampling import SamplingOptions

if TYPE_CHECKING:
    from workers.controller.canary_view import CanaryView

API = "/mint/v1"


class RemoteError(MintError):
    """The gateway answered with an error: ``status`` and ``code`` as it sent them."""

    def __init__(self, message: str, *, status: int, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class RemoteMintClient:
    """A tenant's client over HTTP (see the module docstring); ``http`` replaces the client
    this makes (tests pass Starlette's TestClient or one on an httpx.MockTransport)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        if not api_key or not api_key.startswith("mint_"):
            raise ValueError(
                "api_key: expected a MinT key 'mint_<key id>_<secret>' (from the operators' "
                "`mint keys create`)"
            )
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        self._own = http is None
        self.http = http or httpx.Client(base_url=self.base_url, timeout=timeout_s + 5)
        self.http.headers["Authorization"] = f"Bearer {api_key}"

    # ------------------------------------------------------------------ plumbing

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise MintError(f"{method} {self.base_url}{path}: {type(e).__name__}: {e}") from e
        if r.status_code < 400:
            return r
        try:
            err = r.json()["error"]
            message, code = str(err.get("message")), err.get("code")
        except (ValueError, KeyError, TypeError, AttributeError):
            err, message, code = {}, r.text[:300] or r.reason_phrase, None
        if r.status_code == 409 and code == "move_refused":
            raise CommandRefused(message, current_revision=err.get("current_revision"))
        if r.status_code == 504:
            raise WaitTimeout(message)
        raise RemoteError(
            f"{method} {path}: {r.status_code} {message}", status=r.status_code, code=code
        )

    def close(self) -> None:
        if self._own:
            self.http.close()

    def __enter__(self) -> RemoteMintClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ catalog reads

    def policies(self) -> list[PolicyInfo]:
        data = self._call("GET", f"{API}/policies").json()["data"]
        return [
            PolicyInfo(
                d["policy"], d["base_model"], iso_time(d["created_at"]), iso_time(d["retired_at"])
            )
            for d in data
        ]

    def revisions(self, policy: str, limit: int = 100) -> list[RevisionInfo]:
        """The policy's revisions, newest first (at most ``limit``, up to 500)."""
        data = self._call("GET", f"{API}/policies/{policy}/revisions", params={"limit": limit})
        return [
            RevisionInfo(
                d["revision"],
                d["digest"],
                d["parent_revision"],
                d["base_model"],
                iso_time(d["created_at"]),
                d["created_by"],
                d.get("training") or {},
                d.get("tags") or [],
                d.get("evaluations") or [],
            )
            for d in data.json()["data"]
        ]

    def latest_revision(self, policy: str) -> int | None:
        rows = self.revisions(policy, limit=1)
        return rows[0].revision if rows else None

    def aliases(self, policy: str) -> list[AliasInfo]:
        data = self._call("GET", f"{API}/policies/{policy}/aliases").json()["data"]
        return [
            AliasInfo(d["alias"], d["revision"], d["seq"], iso_time(d["moved_at"])) for d in data
        ]

    # ------------------------------------------------------------------ alias moves

    def _move(self, policy: str, verb: str, body: dict[str, Any]) -> Moved | CanaryInfo:
        d = self._call("POST", f"{API}/policies/{policy}/{verb}", json=body).json()
        if "canary_id" in d:  # a canary started, or ended by a rollback
            return CanaryInfo(
                d["policy"],
                d["alias"],
                d["canary_id"],
                d["event_id"],
                d.get("revision"),
                d.get("incumbent_revision"),
                d.get("share"),
                d.get("outcome"),
                d.get("reason") or "",
            )
        return Moved(
            d["policy"], d["alias"], d["from_revision"], d["to_revision"], d["cause"], d["event_id"]
        )

    def promote(
        self,
        policy: str,
        revision: int,
        *,
        alias: str = "prod",
        expected_revision: int | None = None,
        reason: str = "",
        canary: float | None = None,
    ) -> Moved | CanaryInfo:
        """Move ``alias`` to ``revision`` (through the controller, by compare-and-set). With
        ``canary=share`` the alias stays: ``share`` of its callers get ``revision`` until the
        controller judges the canary (the policy's canary rule); returns the started canary."""
        body: dict[str, Any] = {"alias": alias, "revision": revision, "reason": reason}
        if expected_revision is not None:
            body["expected_revision"] = expected_revision
        if canary is not None:
            body["canary"] = canary
        return self._move(policy, "promote", body)

    def rollback(
        self,
        policy: str,
        *,
        alias: str = "prod",
        to_revision: int | None = None,
        reason: str = "",
        expected_revision: int | None = None,
    ) -> Moved | CanaryInfo:
        """Move ``alias`` back to its previous revision (or ``to_revision``); while a canary of
        the alias runs, end it instead (the alias stays): then the ended canary."""
        body: dict[str, Any] = {"alias": alias, "reason": reason}
        if to_revision is not None:
            body["to_revision"] = to_revision
        if expected_revision is not None:
            body["expected_revision"] = expected_revision
        return self._move(policy, "rollback", body)

    def canary_status(self, policy: str, alias: str | None = "prod") -> CanaryView | None:
        """What the controller knows of the latest canary of ``policy@alias`` (live or decided:
        routing, rule, each side's answers, failures, latency and scores, the decision), or
        None when the latest was on another alias (``alias=None``: any) or there never was
        one; as the direct client's ``canary_status``."""
        from workers.controller.canary_view import CanaryView

        data = self._call("GET", f"{API}/policies/{policy}/canary").json()["view"]
        view = None if data is None else CanaryView.model_validate(data)
        return view if view is not None and alias in (None, view.alias) else None

    def tag(
        self, policy: str, revision: int, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> list[str]:
        """Add ``add`` to revision ``revision``'s tags and take ``remove`` off (through the
        controller, like the direct client's ``tag``); returns the revision's tags afterwards,
        sorted. A bad tag is a 400 (RemoteError), a revision the catalog lacks CommandRefused."""
        body = {"add": list(add), "remove": list(remove)}
        r = self._call("POST", f"{API}/policies/{policy}/revisions/{revision}/tags", json=body)
        return list(r.json()["tags"])

    def retire(self, policy: str, reason: str = "", undo: bool = False) -> Retirement:
        """Retire ``policy`` (``undo``: restore it) through the controller, like the direct
        client's ``retire``: no new revisions or alias moves while retired; its revisions and
        aliases stay readable and served. Returns the controller's answer (the catalog records
        it when the projector reads it: ``policies()`` shows ``retired_at`` then)."""
        body = {"reason": reason, "undo": undo}
        d = self._call("POST", f"{API}/policies/{policy}/retire", json=body).json()
        return Retirement(d["policy"], d["retired"], d["reason"], d["event_id"])

    def feedback(self, policy: str, request_id: str, score: float, comment: str = "") -> str:
        """Score one answer of ``policy`` (``request_id``: its response id or the engine's
        request id) in [0, 1], 1 best, through ``POST /v1/feedback``: the controller joins it
        to the revision that answered and judges a running canary on it. Returns the
        ``feedback.submitted`` event id (accepted; nothing to wait for)."""
        body: dict[str, Any] = {"model": policy, "id": request_id, "score": score}
        if comment:
            body["comment"] = comment
        return self._call("POST", "/v1/feedback", json=body).json()["id"]

    # ------------------------------------------------------------------ configuration

    def configure(
        self,
        policy: str,
        *,
        suite: str,
        thresholds: dict[str, dict[str, float]] | None = None,
        promote_to: str = "prod",
        auto_evaluate: bool = True,
        auto_promote: bool = True,
        rollback_metric: str | None = None,
        rollback_tolerance: float = 0.0,
    ) -> str:
        """Set the policy's lifecycle (a full replacement; the controller applies it shortly):
        ``thresholds`` like ``{"reward": {"min": 0.6}}``. Returns the event id."""
        body = {
            "suite": suite,
            "thresholds": thresholds or {},
            "promote_to": promote_to,
            "auto_evaluate": auto_evaluate,
            "auto_promote": auto_promote,
            "rollback_metric": rollback_metric,
            "rollback_tolerance": rollback_tolerance,
        }
        return self._call("PUT", f"{API}/policies/{policy}/lifecycle", json=body).json()["event_id"]

    # ------------------------------------------------------------------ inference

    def infer(
        self,
        policy: str,
        prompt: str,
        *,
        alias: str = "prod",
        revision: int | None = None,
        max_tokens: int = 8,
        temperature: float = 0.0,
        chat: bool = False,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
        sampling: SamplingOptions | dict[str, Any] | None = None,
        **options: Unpack[SamplingFields],
    ) -> Completion:
        """Answer a prompt with ``policy@alias`` (or a pinned revision) through the gateway's
        ``/v1/completions`` (``chat``: ``/v1/chat/completions``, one user turn).

        Takes the direct client's sampling keywords and ``sampling=`` (mint.sdk.sampling:
        ``top_k``, ``min_p``, ``json_schema``, ``regex``, ``choice``, …) and sends them as
        ``vllm serve`` reads them: its extra body fields and ``structured_outputs``."""
        opts = sampling_options(sampling, **options)
        model = f"{policy}@{revision if revision is not None else alias}"
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if top_p != 1.0:
            body["top_p"] = top_p
        if seed is not None:
            body["seed"] = seed
        if stop:
            body["stop"] = list(stop)
        body.update(openai_fields(opts, chat=chat, logprobs=logprobs))
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        path = "/v1/chat/completions" if chat else "/v1/completions"
        r = self._call("POST", path, json=body)
        data = r.json()
        choice, usage = data["choices"][0], data.get("usage") or {}
        text = choice["message"]["content"] if chat else choice["text"]
        tokens, lps, tops = choice_logprobs(choice, chat)
        rev = r.headers.get("x-mint-revision", "")
        ms = r.headers.get("x-mint-engine-ms")
        return Completion(
            text=text,
            revision=int(rev) if rev.isdigit() else None,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            engine_ms=float(ms) if ms else None,
            stop_reason=choice.get("stop_reason"),
            tokens=tokens,
            logprobs=lps,
            top_logprobs=tops if opts is not None and opts.top_logprobs else None,
            raw=data,
        )

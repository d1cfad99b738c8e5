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

The verbs are the direct client's (mint.sdk.verbs, written once) over ``HttpTransport``; the
tenant is the key's, and a request is validated here before it is sent. A promote or
rollback is a serving command the controller carries out (compare-and-set on the alias); a
refusal raises CommandRefused with the alias's ``current_revision``, no answer in time raises
WaitTimeout (the command stays queued: check ``aliases()`` before sending it again).

Training over HTTP is the Tinker API that the same gateway serves under ``/api/v1`` (README,
"Train your own task"): the official ``tinker`` SDK with ``TINKER_API_KEY=tml-<MinT key>``.
``configure`` sets a policy's lifecycle (suite, gate, rollback rule) like the direct client's
``create_policy``, on the base model the catalog has for the policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from mint.sdk.exceptions import CommandRefused, MintError, WaitTimeout
from mint.sdk.remote_types import (
    AliasInfo,
    Completion,
    PolicyInfo,
    RevisionInfo,
    choice_logprobs,
    controller_answer,
)
from mint.sdk.sampling import openai_fields
from mint.sdk.verbs import Verbs
from schemas.envelope import Command
from schemas.events import InferRequested

if TYPE_CHECKING:
    from workers.controller.canary_view import CanaryView

API = "/mint/v1"


class RemoteError(MintError):
    """The gateway answered with an error: ``status`` and ``code`` as it sent them."""

    def __init__(self, message: str, *, status: int, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _route(policy: str, cmd: Any) -> tuple[str, dict[str, Any]]:
    """The gateway's route and body for a controller command (gateway/lifecycle.py builds the
    same command from them, with the key's id as ``requested_by``)."""
    base = f"{API}/policies/{policy}"
    kind = cmd.event_type
    if kind == "revision.tag":
        return f"{base}/revisions/{cmd.revision}/tags", {"add": cmd.add, "remove": cmd.remove}
    if kind == "policy.retire":
        return f"{base}/retire", {"reason": cmd.reason, "undo": not cmd.retired}
    body = cmd.model_dump(exclude={"requested_by", "share"}, exclude_none=True)
    if kind == "serving.canary":
        body["canary"] = cmd.share
    return f"{base}/{'rollback' if kind == 'serving.rollback' else 'promote'}", body


class HttpTransport:
    """The gateway with an API key (see mint.sdk.transport); ``http`` replaces the client this
    makes (tests pass Starlette's TestClient or one on an httpx.MockTransport)."""

    name = "remote"  # the gateway records the key's id as requested_by instead

    def __init__(
        self, base_url: str, api_key: str, timeout_s: float, http: httpx.Client | None
    ) -> None:
        if not api_key or not api_key.startswith("mint_"):
            raise ValueError(
                "api_key: expected a MinT key 'mint_<key id>_<secret>' (from the operators' "
                "`mint keys create`)"
            )
        self.base_url = base_url.rstrip("/")
        self.own = http is None
        self.http = http or httpx.Client(base_url=self.base_url, timeout=timeout_s + 5)
        self.http.headers["Authorization"] = f"Bearer {api_key}"

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
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

    def data(self, path: str, **kw: Any) -> list[dict[str, Any]]:
        return self.call("GET", path, **kw).json()["data"]

    # The gateway waits for the controller itself (its own timeout: a 504 is WaitTimeout).
    def command(self, policy: str, cmd: Command, answers, where, *, timeout_s=None) -> Any:
        path, body = _route(policy, cmd)
        return controller_answer(self.call("POST", path, json=body).json())

    def publish(self, policy: str, payload: Any) -> str:
        body = {"model": policy, "id": payload.request_id, "score": payload.score}
        if payload.comment:
            body["comment"] = payload.comment
        return self.call("POST", "/v1/feedback", json=body).json()["id"]

    def policies(self) -> list[PolicyInfo]:
        return [PolicyInfo.model_validate(d) for d in self.data(f"{API}/policies")]

    def revisions(self, policy: str, limit: int | None) -> list[RevisionInfo]:
        params = {"limit": 100 if limit is None else limit}
        data = self.data(f"{API}/policies/{policy}/revisions", params=params)
        return [RevisionInfo.model_validate(d) for d in data]

    def aliases(self, policy: str) -> list[AliasInfo]:
        return [AliasInfo.model_validate(d) for d in self.data(f"{API}/policies/{policy}/aliases")]

    def canary_view(self, policy: str) -> CanaryView | None:
        from workers.controller.canary_view import CanaryView

        data = self.call("GET", f"{API}/policies/{policy}/canary").json()["view"]
        return None if data is None else CanaryView.model_validate(data)

    def infer(self, policy: str, req: InferRequested) -> Completion:
        """``/v1/completions`` (``chat``: ``/v1/chat/completions``, one user turn), with the
        sampling settings as ``vllm serve`` reads them: its extra body fields and
        ``structured_outputs``. The gateway names the request (the answer's ``id``)."""
        opts = req.sampling
        body: dict[str, Any] = {
            "model": f"{policy}@{req.revision if req.revision is not None else req.alias}",
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
        }
        if req.top_p != 1.0:
            body["top_p"] = req.top_p
        if req.seed is not None:
            body["seed"] = req.seed
        if req.stop:
            body["stop"] = list(req.stop)
        body.update(openai_fields(opts, chat=req.chat, logprobs=req.logprobs))
        if req.chat:
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            body["prompt"] = req.prompt
        r = self.call("POST", "/v1/chat/completions" if req.chat else "/v1/completions", json=body)
        data = r.json()
        choice, usage = data["choices"][0], data.get("usage") or {}
        tokens, lps, tops = choice_logprobs(choice, req.chat)
        rev = r.headers.get("x-mint-revision", "")
        ms = r.headers.get("x-mint-engine-ms")
        return Completion(
            text=choice["message"]["content"] if req.chat else choice["text"],
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


class RemoteMintClient(Verbs):
    """A tenant's client over HTTP (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.transport = HttpTransport(base_url, api_key, timeout_s, http)
        self.base_url, self.timeout_s, self.http = (
            self.transport.base_url,
            timeout_s,
            self.transport.http,
        )

    def close(self) -> None:
        if self.transport.own:
            self.http.close()

    def __enter__(self) -> RemoteMintClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        ``thresholds`` like ``{"reward": {"min": 0.6}}``. Returns the event id. HTTP only: the
        direct client's ``create_policy`` also names the base model (here the catalog's)."""
        body = {
            "suite": suite,
            "thresholds": thresholds or {},
            "promote_to": promote_to,
            "auto_evaluate": auto_evaluate,
            "auto_promote": auto_promote,
            "rollback_metric": rollback_metric,
            "rollback_tolerance": rollback_tolerance,
        }
        path = f"{API}/policies/{policy}/lifecycle"
        return self.transport.call("PUT", path, json=body).json()["event_id"]

"""The ``model`` of a request: ``policy@alias``, ``policy@N``, ``policy@sha256:<64 hex>``, each
optionally with ``tenant/`` in front. The tenant always comes from the API key; a model that
names another tenant is answered exactly like a missing one (gateway.errors.ModelNotFound),
without looking anything up, so the answer says nothing about what the other tenant owns."""

from __future__ import annotations

from dataclasses import dataclass

from catalog.exceptions import InvalidReference
from catalog.refs import check_alias, check_digest, check_name, check_revision
from gateway.errors import BadRequest, ModelNotFound

MAX_MODEL_CHARS = 300
FORMS = "'policy@alias', 'policy@N' or 'policy@sha256:<64 hex>' (optionally 'tenant/' in front)"


@dataclass(frozen=True)
class ModelRef:
    """A parsed model in the caller's tenant; exactly one of alias, revision, digest is set."""

    tenant: str
    policy: str
    alias: str | None = None
    revision: int | None = None
    digest: str | None = None

    @property
    def target(self) -> str:
        return (
            self.alias or (str(self.revision) if self.revision is not None else self.digest) or ""
        )

    def __str__(self) -> str:
        return f"{self.tenant}/{self.policy}@{self.target}"


def parse_model(text: object, tenant: str) -> ModelRef:
    """Parse ``text`` for a caller of ``tenant``. BadRequest names the expected forms; a model of
    another tenant is ModelNotFound."""
    if not isinstance(text, str) or not text or len(text) > MAX_MODEL_CHARS or "@" not in text:
        raise BadRequest(f"model {str(text)[:80]!r} is not one of {FORMS}", param="model")
    path, _, target = text.partition("@")
    owner, sep, policy = path.rpartition("/")
    try:
        if sep:
            check_name("tenant", owner)
        check_name("policy", policy)
        if target.startswith("sha256:"):
            ref = ModelRef(tenant, policy, digest=check_digest(target))
        elif target.isdigit():
            ref = ModelRef(tenant, policy, revision=check_revision(int(target)))
        else:
            ref = ModelRef(tenant, policy, alias=check_alias(target))
    except InvalidReference as e:
        raise BadRequest(f"model {text[:80]!r}: {e}; expected {FORMS}", param="model") from e
    if sep and owner != tenant:
        raise ModelNotFound(text)
    return ref

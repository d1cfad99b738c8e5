"""The ``model`` of a request: ``policy@alias``, ``policy@N``, ``policy@sha256:<64 hex>``, each
optionally with ``tenant/`` in front. The tenant always comes from the API key; a model that
names another tenant is answered exactly like a missing one (gateway.errors.ModelNotFound),
without looking anything up, so the answer says nothing about what the other tenant owns."""

from __future__ import annotations

from catalog.exceptions import InvalidReference
from catalog.refs import Ref, check_name, ref_to
from gateway.errors import BadRequest, ModelNotFound

MAX_MODEL_CHARS = 300
FORMS = "'policy@alias', 'policy@N' or 'policy@sha256:<64 hex>' (optionally 'tenant/' in front)"


def parse_model(text: object, tenant: str) -> Ref:
    """Parse ``text`` for a caller of ``tenant``. BadRequest names the expected forms; a model of
    another tenant is ModelNotFound."""
    if not isinstance(text, str) or not text or len(text) > MAX_MODEL_CHARS or "@" not in text:
        raise BadRequest(f"model {str(text)[:80]!r} is not one of {FORMS}", param="model")
    path, _, target = text.partition("@")
    owner, sep, policy = path.rpartition("/")
    try:
        if sep:
            check_name("tenant", owner)
        ref = ref_to(tenant, check_name("policy", policy), target)
    except InvalidReference as e:
        raise BadRequest(f"model {text[:80]!r}: {e}; expected {FORMS}", param="model") from e
    if sep and owner != tenant:
        raise ModelNotFound(text)
    return ref

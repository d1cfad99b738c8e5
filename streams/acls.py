"""Who may read and write what: one Kafka principal per worker kind, plus the users' own.

Applied by ``mint dev up --secure`` to the local broker (SASL/SCRAM, StandardAuthorizer, deny
when no ACL matches) and by operators to theirs (``python -m streams.acls`` lists the
bindings). Topics and consumer groups carry the deployment's ``topic_prefix``, so one broker can
host several deployments without one reading another's topics.

- each worker reads the topics it consumes, writes the ones it produces (and the dead-letter
  topic), joins only consumer groups named ``<prefix>-<its groups>``, and may create and describe
  (never read or write) the deployment's other topics, so that ``ensure_topics`` works;
- ``gateway`` (the OpenAI front door) writes ``infer.requests`` (requests and cancels) and
  reads ``infer.results`` and ``infer.deltas`` (streamed text) without a consumer group, and writes tenants' serving commands (``serving.commands``) and
  policy configurations (``policy.config``, base model from the catalog) and reads the
  commands' answers (``serving.events``), also without a group;
- ``upstream`` (systems that submit work) writes only the request topics;
- ``downstream`` (systems that take serving results) reads only ``infer.results``, in groups
  ``<prefix>-downstream*``: every tenant's answers, for a system the operators run;
- ``downstream-<tenant>`` (one per tenant, made by ``mint security tenant``) reads only its
  tenant's namespace ``<prefix>.tenant.<tenant>.``: the topic ``…infer.results`` that the
  ``router`` worker fills with that tenant's answers, in groups named under the same namespace.
  A topic per tenant, because Kafka's ACLs name topics, not keys; tenant names have no dots,
  so one tenant's namespace never starts with another's;
- ``router`` (``mint worker router``) reads ``infer.results`` and writes the tenants' topics;
- ``operator`` (the SDK and the ``mint`` CLI) reads everything and writes requests, commands and
  policy configuration; ``admin`` is the broker's super user (topics, ACLs, users).

Reads use consumers without a group (the SDK, replay) or groups under the prefixes below.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)

from schemas.settings import MintSettings

REQUESTS = ("infer.requests", "rollout.requests", "update.requests", "eval.requests")


@dataclass(frozen=True)
class Grants:
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()  # consumer group name prefixes after "<prefix>-"
    tenant_writes: bool = False  # every tenant's topics (<prefix>.tenant.*): the router


PRINCIPALS: dict[str, Grants] = {
    # group names: workers.projector.PROJECTOR_GROUP and the like (tests/unit/test_acls.py)
    "projector": Grants(
        reads=("export.events", "serving.events", "eval.results"),
        writes=("policy.state", "dlq"),
        groups=("catalog-projector",),
    ),
    "controller": Grants(
        reads=(
            "policy.config",
            "export.events",
            "eval.requests",
            "eval.results",
            "serving.commands",
            "serving.events",
            # a canary is judged on its answers and their feedback scores
            "infer.results",
            "feedback",
        ),
        writes=("eval.requests", "serving.events", "policy.state", "dlq"),
        groups=("controller",),
    ),
    "trainer": Grants(
        reads=("update.requests", "train.steps"),
        writes=("update.results", "train.step.results", "export.events", "dlq"),
        groups=("trainer",),
    ),
    # Engines read their own results topics too: a redelivered request already answered there
    # is skipped (streams.answered); serving.events and policy.state are read without a group.
    "engine": Grants(
        reads=(
            "infer.requests",
            "load.requests",
            "serving.events",
            "policy.state",
            "rollout.requests",
            "eval.requests",
            "infer.results",
            "rollout.results",
            "eval.results",
        ),
        writes=(
            "infer.results",
            "load.requests",
            "load.events",
            "rollout.results",
            "eval.results",
            "infer.deltas",
            "dlq",
        ),
        groups=("serving", "rollout", "evaluator"),
    ),
    # The OpenAI gateway (`mint gateway`): asks the engines, follows their answers without a
    # group (each instance takes only its own; gateway/README.md); a tenant's promote/rollback
    # goes to the controller as a serving command, answered on serving.events, and its policy's
    # lifecycle configuration to policy.config (gateway/lifecycle).
    "gateway": Grants(
        reads=("infer.results", "infer.deltas", "train.step.results", "serving.events"),
        writes=(
            "infer.requests",
            "train.steps",
            "serving.commands",
            "policy.config",
            "feedback",
        ),
    ),
    "upstream": Grants(writes=(*REQUESTS, "feedback")),
    "downstream": Grants(reads=("infer.results",), groups=("downstream",)),
    # copies each answer to its tenant's topic (workers.router.ROUTER_GROUP)
    "router": Grants(
        reads=("infer.results",), writes=("dlq",), groups=("tenant-router",), tenant_writes=True
    ),
}
SERVICE_PRINCIPALS = ("projector", "controller", "trainer", "engine", "router")
ADMIN = "admin"
OPERATOR = "operator"
ALL_PRINCIPALS = (ADMIN, OPERATOR, *PRINCIPALS)


def bindings(settings: MintSettings) -> list:
    """kafka-python ACL bindings for every principal but the super user."""
    from streams.topics import TOPICS

    allow, literal, prefixed = (
        ACLPermissionType.ALLOW,
        ACLResourcePatternType.LITERAL,
        ACLResourcePatternType.PREFIXED,
    )
    out = []

    def grant(principal: str, op, rtype, name: str, pattern=literal) -> None:
        out.append(ACL(f"User:{principal}", "*", op, allow, ResourcePattern(rtype, name, pattern)))

    grants = dict(PRINCIPALS)
    grants[OPERATOR] = Grants(
        reads=tuple(TOPICS),
        writes=(*REQUESTS, "serving.commands", "policy.config", "feedback"),
        groups=("operator",),
    )
    for principal, g in grants.items():
        for topic in g.reads:
            grant(principal, ACLOperation.READ, ResourceType.TOPIC, settings.topic(topic))
        for topic in g.writes:
            grant(principal, ACLOperation.WRITE, ResourceType.TOPIC, settings.topic(topic))
            grant(principal, ACLOperation.DESCRIBE, ResourceType.TOPIC, settings.topic(topic))
        if principal != "upstream" and principal != "downstream":
            # Workers and the SDK make sure the registry's topics exist (ensure_topics) and
            # wait for their metadata: create and describe the deployment's topics, no more.
            for op in (ACLOperation.CREATE, ACLOperation.DESCRIBE):
                grant(principal, op, ResourceType.TOPIC, f"{settings.topic_prefix}.", prefixed)
        for group in g.groups:
            grant(
                principal,
                ACLOperation.READ,
                ResourceType.GROUP,
                f"{settings.topic_prefix}-{group}",
                prefixed,
            )
        if g.tenant_writes:
            for op in (ACLOperation.WRITE, ACLOperation.DESCRIBE):
                grant(principal, op, ResourceType.TOPIC, settings.topic("tenant."), prefixed)
    # operator replays (streams.replay.fresh_group) run under groups of their own
    grant(OPERATOR, ACLOperation.READ, ResourceType.GROUP, "replay.", prefixed)
    return out


def tenant_principal(tenant: str) -> str:
    """The Kafka principal that reads ``tenant``'s answers (``downstream-<tenant>``)."""
    return f"downstream-{tenant}"


def tenant_bindings(settings: MintSettings, tenant: str) -> list:
    """``downstream-<tenant>`` reads (and describes) the topics of its tenant's namespace and
    joins groups named under it; nothing else."""
    from streams.topics import tenant_namespace

    ns = tenant_namespace(settings, tenant)
    user = f"User:{tenant_principal(tenant)}"

    def acl(op, rtype):
        return ACL(
            user,
            "*",
            op,
            ACLPermissionType.ALLOW,
            ResourcePattern(rtype, ns, ACLResourcePatternType.PREFIXED),
        )

    return [
        acl(ACLOperation.READ, ResourceType.TOPIC),
        acl(ACLOperation.DESCRIBE, ResourceType.TOPIC),
        acl(ACLOperation.READ, ResourceType.GROUP),
    ]


def apply_tenant(settings: MintSettings, tenant: str, password: str) -> list[str]:
    """As the super user: create or update ``downstream-<tenant>``'s SCRAM login, its ACLs and
    its tenant's topics (so a consumer can subscribe before the first answer). Idempotent.
    Returns the topics newly created."""
    from streams.topics import ensure_tenant_topics

    _apply(settings, tenant_bindings(settings, tenant), {tenant_principal(tenant): password})
    return ensure_tenant_topics(settings, tenant)


def apply(settings: MintSettings, passwords: dict[str, str] | None = None) -> int:
    """Create every binding on the broker (as the settings' principal: the super user), and
    with ``passwords`` (principal → password) the SCRAM logins of those principals, so that a
    principal added by an upgrade (``router``) can log in without reformatting the broker."""
    acls = bindings(settings)
    _apply(settings, acls, {p: pw for p, pw in (passwords or {}).items() if p != ADMIN})
    return len(acls)


def _apply(settings: MintSettings, acls: list, logins: dict[str, str]) -> None:
    from kafka.admin import UserScramCredentialUpsertion

    from streams.clients import make_admin

    admin = make_admin(settings)
    try:
        if logins:
            failed = admin.alter_user_scram_credentials(
                [
                    UserScramCredentialUpsertion(user, settings.kafka_sasl_mechanism, password)
                    for user, password in sorted(logins.items())
                ]
            )
            errors = {user: e for user, e in failed.items() if e}
            if errors:
                raise RuntimeError(f"broker refused the SCRAM logins of {errors}")
        result = admin.create_acls(acls)
        if result.get("failed"):
            raise RuntimeError(f"broker refused ACLs: {result['failed'][:3]}")
    finally:
        admin.close()


if __name__ == "__main__":
    from schemas.settings import get_settings

    for acl in bindings(get_settings()):
        print(acl)

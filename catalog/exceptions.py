"""Typed catalog errors. Each category also inherits the stdlib exception it replaces, so callers
that only know ``ValueError``/``LookupError`` still catch them; messages name the field, the value,
what was expected and what to do."""

from __future__ import annotations

from schemas.exceptions import MintError


class CatalogError(MintError):
    """Base of every catalog error."""


class InvalidReference(CatalogError, ValueError):
    """A name, digest or ``tenant/policy@…`` reference is malformed."""


class MalformedDigest(InvalidReference):
    """An adapter digest is not ``sha256:`` followed by 64 lowercase hex digits."""


class NotFound(CatalogError, LookupError):
    """Something the caller named does not exist."""


class PolicyNotFound(NotFound):
    pass


class RevisionNotFound(NotFound):
    pass


class AliasNotFound(NotFound):
    pass


class TenantNotFound(NotFound):
    """The tenant has no access row (``mint tenants create``): it cannot hold API keys."""


class KeyNotFound(NotFound):
    """No API key with that key id (of that tenant)."""


class CrossTenantReference(CatalogError, PermissionError):
    """A reference points into another tenant's (or another policy's) catalog."""


class Conflict(CatalogError, RuntimeError):
    """The catalog changed under the caller, or the request contradicts what is stored."""


class AliasConflict(Conflict):
    """A compare-and-set on an alias lost: the alias is not at the expected revision."""

    def __init__(self, message: str, *, current: int | None) -> None:
        super().__init__(message)
        self.current = current


class PolicyExists(Conflict):
    """The policy exists with different settings (e.g. another base model)."""


class PolicyRetired(Conflict):
    """The policy was retired; nothing can be registered or promoted in it."""


class RegistrationInProgress(Conflict):
    """Another registrant holds the claim on this digest; retry shortly."""


class MigrationError(CatalogError, RuntimeError):
    """A schema migration failed or an applied migration file was changed afterwards."""


class CatalogUnavailable(CatalogError, ConnectionError):
    """Cassandra (or the adapter store, :class:`StoreUnavailable`) did not answer: unavailable,
    timed out, no host, connection dropped. Transient: consumer loops wait it out and never
    dead-letter for it; catch it before ``CatalogError`` wherever a CatalogError is a refusal."""


class CatalogRefused(CatalogError, ValueError):
    """Cassandra answered and refused the statement for good (InvalidRequest, SyntaxException,
    ConfigurationException, AlreadyExists...): the schema is missing or behind, or the statement
    is wrong. Retrying cannot help; a record that meets it is dead-lettered with this reason, a
    worker that meets it at start-up exits. The message names the statement."""


class CatalogUnauthorized(CatalogRefused, PermissionError):
    """Cassandra refused the statement because the role lacks a grant (Unauthorized). The message
    names the role's missing permission and the statement; grant it, then replay."""


# Adapter store (catalog/store.py, catalog/artifacts.py): refusals of adapter directories.


class AdapterRejected(CatalogError, ValueError):
    """An adapter directory is not a valid, safe MinT revision; nothing was stored or loaded."""


class UnsafeWeightsFormat(AdapterRejected):
    """Weights are not (only) safetensors: pickle formats (.bin, .pt, .pth, .pkl) are refused."""


class BaseModelMismatch(AdapterRejected):
    """The adapter was trained on another base model (fingerprints differ)."""


class AdapterShapeMismatch(AdapterRejected):
    """Rank or target modules in the config/manifest disagree with the tensors."""


class NonFiniteWeights(AdapterRejected):
    """A tensor holds NaN or Inf."""


class StoreUnavailable(CatalogUnavailable):
    """The adapter store's filesystem or endpoint is not reachable (root missing or not mounted,
    I/O error, stale or disconnected mount, timed out, full). Transient, like Cassandra being
    down: never a reason to refuse or dead-letter a record. ``AdapterStore.io`` raises it."""


class AdapterCorrupted(CatalogError, OSError):
    """Stored bytes no longer match the recorded digest (or the manifest is unreadable)."""


class AdapterNotFound(NotFound):
    """No stored revision at that URI or digest."""

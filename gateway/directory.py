"""What the gateway reads from the catalog (blocking reads; the app caches them and calls them
off the event loop): API keys, tenants' rates, policies, digests, a tenant's models."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from catalog.access import AccessRepository
from catalog.exceptions import NotFound
from catalog.models import ApiKey, TenantAccess
from catalog.refs import Ref
from catalog.repository import CatalogRepository

MAX_MODELS = 1000


@dataclass(frozen=True)
class ModelEntry:
    """One servable model of a tenant: ``policy@alias`` for every alias that points somewhere."""

    id: str
    created: datetime | None


class CatalogDirectory:
    def __init__(self, catalog: CatalogRepository, access: AccessRepository) -> None:
        self.catalog, self.access = catalog, access

    def key(self, key_id: str) -> ApiKey | None:
        return self.access.get_key(key_id)

    def tenant(self, tenant: str) -> TenantAccess | None:
        return self.access.get_tenant(tenant)

    def policy_exists(self, tenant: str, policy: str) -> bool:
        try:
            self.catalog.get_policy(tenant, policy)
        except NotFound:
            return False
        return True

    def base_model(self, tenant: str, policy: str) -> str | None:
        try:
            return self.catalog.get_policy(tenant, policy).base_model
        except NotFound:
            return None

    def revision_of_digest(self, tenant: str, policy: str, digest: str) -> int | None:
        try:
            return self.catalog.resolve(Ref(tenant, policy, digest=digest)).revision
        except NotFound:
            return None

    def models(self, tenant: str) -> list[ModelEntry]:
        out = []
        for pol in self.catalog.list_policies(tenant):
            for alias in self.catalog.list_aliases(tenant, pol.policy):
                if alias.revision is not None:
                    out.append(ModelEntry(f"{pol.policy}@{alias.alias}", pol.created_at))
            if len(out) >= MAX_MODELS:
                break
        return sorted(out[:MAX_MODELS], key=lambda m: m.id)

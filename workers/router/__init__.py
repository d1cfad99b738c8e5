"""The tenant router: copies every answer on ``infer.results`` to its tenant's own topic
(``<prefix>.tenant.<tenant>.infer.results``), which only that tenant's downstream principal may
read (streams.acls). ``run_router(settings)`` is the consumer-group member."""

from workers.router.main import ROUTER_GROUP, ROUTER_TOPICS, TenantCopier, main, run_router

__all__ = ["ROUTER_GROUP", "ROUTER_TOPICS", "TenantCopier", "main", "run_router"]

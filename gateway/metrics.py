"""Prometheus metrics of one gateway instance, in a registry of its own (two instances in one
process, as in the tests, do not share counters). Served at ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.http_requests = Counter(
            "mint_gateway_http_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.http_seconds = Histogram(
            "mint_gateway_http_request_seconds",
            "time from request to response headers",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_seconds = Histogram(
            "mint_gateway_engine_seconds",
            "publish of infer.requested to its last answer",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.infer_requests = Counter(
            "mint_gateway_infer_requests",
            "infer.requested published (one per prompt; n choices each)",
            registry=r,
        )
        self.replies = Counter(
            "mint_gateway_replies",
            "records read from infer.results, by what became of them: own "
            "(a waiting request's answer), late (own, nobody waits any more), "
            "foreign (another instance's or caller's), undecodable",
            ["outcome"],
            registry=r,
        )
        self.pending = Gauge(
            "mint_gateway_pending_requests", "requests waiting for their answers", registry=r
        )
        self.auth_failures = Counter("mint_gateway_auth_failures", "401 answers", registry=r)
        self.rate_limited = Counter(
            "mint_gateway_rate_limited",
            "429 answers: a tenant over its rate, or too many failed key "
            "checks of a key id or client address",
            registry=r,
        )
        self.timeouts = Counter(
            "mint_gateway_engine_timeouts", "503 answers: no engine answered in time", registry=r
        )
        self.tokens = Counter(
            "mint_gateway_tokens", "tokens of answered requests", ["kind"], registry=r
        )

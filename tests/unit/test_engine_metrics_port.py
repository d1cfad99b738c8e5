"""Issue 27: an engine's metrics port serves vLLM's ``vllm:*`` metrics, which vLLM's
PrometheusStatLogger registers in prometheus_client's default REGISTRY (faked here with metrics
of the same types and labels, under probe names: in a whole-suite run a real engine has already
registered vLLM's own names in this process)."""

from __future__ import annotations

import urllib.request

from prometheus_client import REGISTRY, Gauge, Histogram

from streams import health


def test_the_default_registrys_vllm_metrics_are_served_on_the_metrics_port() -> None:
    labels = {"model_name": "/models/base", "engine": "0"}
    ttft = Histogram("vllm:unit_probe_ttft_seconds", "fake", list(labels), buckets=(0.1, 1.0))
    lora = Gauge(
        "vllm:unit_probe_lora_requests_info",
        "fake",
        ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
    )
    try:
        ttft.labels(**labels).observe(0.05)
        lora.labels("4", "", "mint-3f2a9c01b7de").set(1.0)
        port = health.serve(0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert (
            'vllm:unit_probe_ttft_seconds_bucket{engine="0",le="0.1",'
            'model_name="/models/base"} 1.0' in body
        )
        assert "vllm:unit_probe_ttft_seconds_count" in body
        assert 'running_lora_adapters="mint-3f2a9c01b7de"' in body
        assert "mint_consumer_waiting_out_outage" in body  # MinT's own, on the same port
    finally:  # vLLM replaces its collectors by name; leave none behind for other tests
        REGISTRY.unregister(ttft)
        REGISTRY.unregister(lora)

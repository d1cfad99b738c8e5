"""Issue 27: vLLM's own metrics (``vllm:*``, registered by AsyncLLM's PrometheusStatLogger in the
default registry) on an engine's ``/metrics`` after real generations on the session's engine,
one of them with an adapter named as the working set names it."""

from __future__ import annotations

import hashlib

from streams import health
from tests._metrics import scrape, total
from workers.serving.engine import GenRequest, LoraHandle
from workers.serving.ids import lora_int_id, lora_name

from .conftest import PROMPTS

COUNTED = (  # histograms (one observation per request) and counters that must move
    "vllm:time_to_first_token_seconds_count",
    "vllm:request_time_per_output_token_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
)


def test_vllm_metrics_are_served_after_a_generate_with_the_adapter_named(
    serving_engine, variant_factory
) -> None:
    port = health.serve(0)
    adapter = variant_factory(2701)
    digest = (
        "sha256:" + hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    )
    handle = LoraHandle(lora_int_id(digest), lora_name(digest), adapter)
    before = scrape(port)
    serving_engine.load(handle)
    try:
        results = serving_engine.generate(
            [GenRequest(PROMPTS[0], 4), GenRequest(PROMPTS[1], 4, lora=handle)]
        )
    finally:
        serving_engine.evict(handle.lora_id)
    after = scrape(port)
    assert len(results) == 2 and all(r.samples[0].token_ids for r in results)

    model = {"model_name": serving_engine.config.model, "engine": "0"}
    for name in COUNTED:
        assert total(after, name, **model) - total(before, name, **model) == 2, name
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert total(after, name, **model) - total(before, name, **model) > 0, name
    gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    for name in gauges:
        assert any(n == name and ("model_name", model["model_name"]) in lb for n, lb in after), name
    adapters = {  # the adapter names of every lora_requests_info series: our LoraHandle.name
        dict(lb)["running_lora_adapters"] for n, lb in after if n == "vllm:lora_requests_info"
    }
    assert any(handle.name in a.split(",") for a in adapters), adapters

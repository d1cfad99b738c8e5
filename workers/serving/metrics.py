"""Prometheus metrics of an engine: its working set, cold loads, waves and request latency.

Served with the consumer loop's on ``MINT_METRICS_PORT`` (streams.health). One engine per
process, so no engine label (Prometheus adds the scrape target's). Children with fixed labels
are bound here once; the hot paths only observe or increment.

- ``mint_working_set_adapters{tier}``: adapters held per tier (gpu ⊂ cpu; disk: the local cache);
- ``mint_working_set_slots{tier}``: the tier's capacity (max_loras, max_cpu_loras,
  max_disk_loras), so occupancy is adapters / slots;
- ``mint_working_set_lookups_total{tier,result}``: hit or miss per tier: gpu, an adapter of a
  wave already held a GPU slot; cpu, ``ensure`` found it resident; disk, a CPU miss found the
  verified files in the local cache (a miss fetches them from the store);
- ``mint_working_set_evictions_total{tier,reason}``: cpu (lru, requested, shutdown) and disk;
- ``mint_adapter_load_seconds{source}``: a cold load into the engine (fetch from ``store`` or
  the local ``disk`` cache, verification, engine load);
- ``mint_adapter_load_failures_total{error}``: failed loads by error class;
- ``mint_serving_load_wave_adapters``: adapters loaded per wave of cold loads;
- ``mint_serving_running_requests``: requests submitted to vLLM and not finished (at most
  ``max_in_flight``); ``mint_serving_generate_seconds``: one request inside the engine,
  submitted to finished;
- ``mint_serving_infer_latency_seconds{load}``: request received to answer, ``cold`` (it waited
  for its adapter's load) or ``warm``;
- ``mint_serving_infer_failures_total{stage}``: error results by stage (resolve, validate,
  load, generate, expired);
- ``mint_serving_duplicates_total``: requests delivered again with an event id already taken
  (answered once);

vLLM's own metrics (``vllm:*``) are served on the same port: the engine runs vLLM's AsyncLLM
with stats logging on, whose PrometheusStatLogger registers them in prometheus_client's default
REGISTRY, the one streams.health serves (vLLM 0.32, vllm/v1/metrics/loggers.py). Each carries
``model_name`` (vLLM's served model name: the base model as the engine was given it, its folder
unless the engine names it) and ``engine`` (vLLM's data-parallel index: ``"0"``, one engine per
process). The ones the dashboard's generation row charts:

- ``vllm:time_to_first_token_seconds``, ``vllm:request_time_per_output_token_seconds``,
  ``vllm:inter_token_latency_seconds``, ``vllm:e2e_request_latency_seconds`` and
  ``vllm:request_{queue,prefill,decode,inference}_time_seconds``: histograms (``_bucket``,
  ``_sum``, ``_count``) per request, or per token for the inter-token latency;
- ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``: gauges, requests in the
  running batch and in vLLM's queue (``vllm:num_requests_waiting_by_reason{reason}``);
- ``vllm:kv_cache_usage_perc``: gauge, KV-cache blocks in use, 0 to 1 (1 is full);
- ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``: counters, tokens prefilled
  and generated (``vllm:prompt_tokens_cached_total``: prompt tokens the prefix cache supplied;
  ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``);
- ``vllm:request_success_total{finished_reason}`` (stop, length, abort, …),
  ``vllm:num_preemptions_total``, ``vllm:request_prompt_tokens`` /
  ``vllm:request_generation_tokens`` (histograms of tokens per request),
  ``vllm:cache_config_info`` (the KV-cache settings as labels, value 1).

LoRA: ``vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}`` (no
model_name or engine label) is a gauge set to the time of vLLM's latest step; the two adapter
labels are comma-separated adapter names (0.32 writes every adapter with a request in vLLM to
both, whether it runs or waits), so each new mix of adapters is a new series: read the newest,
e.g. ``topk(1, vllm:lora_requests_info)`` per instance. vLLM names an adapter by our
LoraHandle.name, which is content-derived, not policy-derived (workers.serving.ids.lora_name):
``mint-`` + the first 12 hex digits of the revision's sha256 digest, e.g. ``mint-3f2a9c01b7de``
for ``sha256:3f2a9c01b7de…``. To map it to a policy and revision: ``mint catalog revisions
TENANT/POLICY`` lists each revision's digest starting with those 12 digits, and the engine's
"adapter loaded" / "adapter evicted" log lines carry the full digest with the revision. Two
policies that exported the same bytes share one name (the same weights, loaded once).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TIERS = ("gpu", "cpu", "disk")
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LOAD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

ADAPTERS = Gauge(
    "mint_working_set_adapters", "adapters the engine holds, per tier (gpu within cpu)", ["tier"]
)
SLOTS = Gauge("mint_working_set_slots", "capacity of the tier in adapters", ["tier"])
LOOKUPS = Counter(
    "mint_working_set_lookups",
    "working-set lookups per tier and result (hit/miss)",
    ["tier", "result"],
)
EVICTIONS = Counter(
    "mint_working_set_evictions", "adapters evicted, per tier and reason", ["tier", "reason"]
)
LOAD_SECONDS = Histogram(
    "mint_adapter_load_seconds",
    "cold load of an adapter into the engine (fetch, verify, engine load)",
    ["source"],
    buckets=LOAD_BUCKETS,
)
LOAD_FAILURES = Counter(
    "mint_adapter_load_failures", "adapter loads that failed, by error class", ["error"]
)
LOAD_WAVE = Histogram(
    "mint_serving_load_wave_adapters",
    "adapters loaded per wave of cold loads",
    buckets=SIZE_BUCKETS,
)
RUNNING = Gauge("mint_serving_running_requests", "requests submitted to vLLM and not finished")
GENERATE_SECONDS = Histogram(
    "mint_serving_generate_seconds",
    "one request inside the engine, submitted to finished",
    buckets=LATENCY_BUCKETS,
)
INFER_LATENCY = Histogram(
    "mint_serving_infer_latency_seconds",
    "inference request received to answer built, cold (waited for a load) or warm",
    ["load"],
    buckets=LATENCY_BUCKETS,
)
INFER_FAILURES = Counter("mint_serving_infer_failures", "error results, by stage", ["stage"])
DUPLICATES = Counter("mint_serving_duplicates", "requests delivered again (answered once)")

# Bound once: the per-request and per-lookup paths only increment.
INFER_COLD, INFER_WARM = INFER_LATENCY.labels("cold"), INFER_LATENCY.labels("warm")
HIT = {tier: LOOKUPS.labels(tier, "hit") for tier in TIERS}
MISS = {tier: LOOKUPS.labels(tier, "miss") for tier in TIERS}
HELD = {tier: ADAPTERS.labels(tier) for tier in TIERS}
LOADED_FROM = {source: LOAD_SECONDS.labels(source) for source in ("disk", "store")}


def set_capacity(gpu: int, cpu: int, disk: int) -> None:
    for tier, n in zip(TIERS, (gpu, cpu, disk), strict=True):
        SLOTS.labels(tier).set(n)


def set_occupancy(gpu: int, cpu: int, disk: int) -> None:
    HELD["gpu"].set(gpu)
    HELD["cpu"].set(cpu)
    HELD["disk"].set(disk)

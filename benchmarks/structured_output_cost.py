"""What a JSON schema costs per request: the same chat prompts with and without
``response_format: json_schema``, on ``vllm serve`` and on MinT (gateway → Kafka → engine), one
server after the other (one vLLM at a time), SmolLM2-135M-Instruct with one LoRA adapter.

Per server: requests one at a time through the real ``openai`` client, temperature 0, plain and
schema requests interleaved (prompt i: plain then schema for even i, schema then plain for odd
i, so a drift of the machine's load falls on both alike). The first schema request is timed
apart (vLLM compiles the grammar; later ones reuse it). Figures: ms per request (p50, mean),
completion tokens, ms per output token, the share of schema answers that parse as JSON, and
the ratios schema / plain per request and per token. One JSON line; the target: MinT's schema
cost per token (its ratio) at most 1.2 × vllm serve's. Exit 1 if missed.

    python benchmarks/structured_output_cost.py          # 24 prompts, 64 tokens
    python benchmarks/structured_output_cost.py --smoke  # 4 prompts, 48 tokens
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import emit, machine, parser, targets_and_met  # noqa: E402
from benchmarks._openai_load import TOPICS  # noqa: E402

MODEL = "smollm2-135m-instruct"
TENANT, POLICY = "bench", "so"
TARGET_RATIO_OVER_VLLM = 1.2
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 30},
        "summary": {"type": "string", "maxLength": 80},
        "difficulty": {"type": "string", "enum": ["easy", "medium", "hard"]},
    },
    "required": ["topic", "summary", "difficulty"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "explainer", "schema": SCHEMA}}


def say(message: str) -> None:
    print(f"[structured_output_cost {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr)


def prompts(n: int) -> list[list[dict[str, str]]]:
    """The same prompts for both variants: each asks for the JSON the schema describes."""
    return [
        [
            {
                "role": "user",
                "content": f"Explain {TOPICS[i % len(TOPICS)]} as JSON with the fields topic, "
                "summary (one sentence) and difficulty (easy, medium or hard).",
            }
        ]
        for i in range(n)
    ]


def timed(client, model: str, messages, max_tokens: int, schema: bool) -> dict:
    extra = {"response_format": RESPONSE_FORMAT} if schema else {}
    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, **extra
    )
    seconds = time.perf_counter() - t0
    text = r.choices[0].message.content or ""
    valid = None
    if schema:
        try:
            valid = set(json.loads(text)) == set(SCHEMA["required"])
        except ValueError:
            valid = False
    return {"s": seconds, "tokens": r.usage.completion_tokens, "valid": valid, "text": text}


def measure(base_url: str, key: str, model: str, args) -> dict:
    """One server's figures (see the module's docstring)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=600)
    timed(client, model, [{"role": "user", "content": "Hello"}], 4, False)  # warm
    first = timed(client, model, prompts(1)[0], args.max_tokens, True)  # compiles the grammar
    runs: dict[str, list[dict]] = {"plain": [], "schema": []}
    for i, messages in enumerate(prompts(args.prompts)):
        order = (False, True) if i % 2 == 0 else (True, False)
        for schema in order:
            runs["schema" if schema else "plain"].append(
                timed(client, model, messages, args.max_tokens, schema)
            )
    out = {name: figures(rs) for name, rs in runs.items()}
    out["schema"]["valid_json_share"] = round(
        sum(bool(r["valid"]) for r in runs["schema"]) / len(runs["schema"]), 3
    )
    out["schema_first_ms"] = round(first["s"] * 1000, 1)
    out["ratio_per_request"] = round(out["schema"]["ms_mean"] / out["plain"]["ms_mean"], 3)
    out["ratio_per_token"] = round(out["schema"]["ms_per_token"] / out["plain"]["ms_per_token"], 3)
    out["texts"] = [r["text"] for r in runs["schema"][:2]]
    return out


def figures(runs: list[dict]) -> dict:
    ms = [r["s"] * 1000 for r in runs]
    tokens = [r["tokens"] for r in runs]
    return {
        "requests": len(runs),
        "ms_p50": round(statistics.median(ms), 1),
        "ms_mean": round(statistics.fmean(ms), 1),
        "completion_tokens_mean": round(statistics.fmean(tokens), 1),
        "ms_per_token": round(sum(ms) / max(1, sum(tokens)), 2),
    }


@contextlib.contextmanager
def vllm_serve(model: Path, adapter: Path, work: Path) -> Iterator[str]:
    from benchmarks._vllm_serve import VllmServe
    from benchmarks.serving_vs_vllm import ENGINE, ENV, VLLM_ONLY, flags

    args = [*flags(ENGINE), *VLLM_ONLY]
    with VllmServe(model, {POLICY: adapter}, work / "vllm.log", engine_args=args, env=ENV) as s:
        say(f"vllm serve ready in {s.wait_healthy():.0f} s")
        yield s.url


def main() -> int:
    ap = parser(__doc__, "4 prompts, 48 tokens")
    ap.size("--prompts", 4, 24, "per variant")
    ap.size("--max-tokens", 48, 64, "per answer")
    args = ap.parse_args()

    from benchmarks._mint_stack import ENGINE, make_adapters, mint_stack
    from schemas.logs import configure_logging
    from schemas.settings import MintSettings
    from workers.models.pretrained import fetch

    configure_logging("WARNING", "console")
    model = fetch(MODEL, MintSettings().models_dir)
    work = Path(tempfile.mkdtemp(prefix="mint-soc-"))
    started = time.perf_counter()
    try:
        adapter = make_adapters(model, work / "adapters", 1)[0]
        with vllm_serve(model, adapter, work) as url:
            vllm = measure(url, "none", POLICY, args)
        say(f"vllm serve: {vllm}")
        with mint_stack(model, {POLICY: adapter}, work, tag="soc", partitions=1) as m:
            # the first request waits for the engine's start and the adapter
            mint_figures = measure(m.url, m.key, f"{POLICY}@prod", args)
        say(f"MinT: {mint_figures}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    over = mint_figures["ratio_per_token"] / vllm["ratio_per_token"]
    out = {
        "benchmark": "structured_output_cost",
        "smoke": args.smoke,
        "model": MODEL,
        "load": {
            "prompts_per_variant": args.prompts,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "client": "openai.OpenAI chat.completions, one request at a time",
            "schema": "response_format json_schema (2 strings of at most 30 and 80 characters, "
            "an enum)",
        },
        "engine": ENGINE,
        "vllm": vllm,
        "mint": mint_figures,
        "mint_ratio_over_vllm_ratio": round(over, 3),
        "same_schema_texts": vllm["texts"] == mint_figures["texts"],
        "wall_s": round(time.perf_counter() - started, 1),
        **machine(),
        **targets_and_met(mint_ratio_over_vllm_ratio=(over, "<=", TARGET_RATIO_OVER_VLLM)),
    }
    return emit(out)


if __name__ == "__main__":
    raise SystemExit(main())

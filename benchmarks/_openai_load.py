"""Streaming chat load through the real ``openai`` client, the same for any OpenAI-compatible
server (``vllm serve``, MinT's gateway): N chat prompts, C concurrent streaming clients, and per
request the time to its first content chunk, the gaps between its content chunks and its
completion tokens (from ``stream_options.include_usage``). Used by benchmarks/serving_vs_vllm.py.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

from benchmarks._harness import pct

# Chat prompts of similar length: each asks for a short explanation, so answers run to a few
# dozen tokens and the two servers decode comparable amounts.
TOPICS = [
    "photosynthesis", "gravity", "a rainbow", "the water cycle", "volcanoes", "earthquakes",
    "tides", "the seasons", "lightning", "a solar eclipse", "magnets", "rust",
    "vaccines", "DNA", "the immune system", "sleep", "muscles growing", "digestion",
    "the heart", "memory", "a compiler", "a database index", "recursion", "encryption",
    "the internet", "a hash table", "garbage collection", "an operating system", "a CPU cache",
    "version control", "inflation", "interest rates", "supply and demand", "a stock market",
    "insurance", "taxes", "democracy", "a constitution", "the printing press", "the wheel",
    "bread rising", "ice floating", "boiling water", "a refrigerator", "an airplane flying",
    "a bicycle staying upright", "a rocket", "a satellite orbit", "black holes", "stars shining",
    "the Moon's phases", "the northern lights", "coral reefs", "bird migration", "bees making honey",
    "a tree growing", "soil", "clouds", "wind", "snowflakes", "deserts", "rivers", "glaciers",
    "a language changing over time",
]  # fmt: skip


def chat_prompts(n: int) -> list[list[dict[str, str]]]:
    """``n`` one-turn chats (the topic list repeated if ``n`` is larger)."""
    return [
        [{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} in two sentences."}]
        for i in range(n)
    ]


@dataclass
class Streamed:
    """One streamed answer as the client saw it."""

    index: int
    model: str
    ttft_s: float | None = None  # request sent -> first chunk with content
    gaps_s: list[float] = field(default_factory=list)  # between consecutive content chunks
    chunks: int = 0  # chunks with content
    completion_tokens: int | None = None  # the usage chunk's count
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


async def _one(client, index: int, model: str, messages, max_tokens: int) -> Streamed:
    out = Streamed(index, model)
    t0 = last = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts = []
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                out.completion_tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.finish_reason:
                    out.finish_reason = choice.finish_reason
                content = choice.delta.content if choice.delta else None
                if not content:
                    continue
                if out.chunks == 0:
                    out.ttft_s = now - t0
                else:
                    out.gaps_s.append(now - last)
                last = now
                out.chunks += 1
                parts.append(content)
        out.text = "".join(parts)
    except Exception as e:  # one failed request is a counted figure, not the end of the run
        out.error = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def run_load(
    base_url: str,
    api_key: str,
    models: list[str],
    prompts: list,
    *,
    clients: int,
    max_tokens: int,
    timeout_s: float = 600.0,
) -> tuple[list[Streamed], float]:
    """Send ``prompts[i]`` to ``models[i]`` from ``clients`` concurrent streaming clients; the
    answers in prompt order and the wall time of the whole load (s)."""
    if len(models) != len(prompts):
        raise ValueError(f"models has {len(models)} entries, prompts {len(prompts)}: give one each")

    async def load() -> tuple[list[Streamed], float]:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)
        todo: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(prompts)):
            todo.put_nowait(i)
        results: list[Streamed] = []

        async def worker() -> None:  # one streaming client: its next request when the last ends
            while not todo.empty():
                i = todo.get_nowait()
                results.append(await _one(client, i, models[i], prompts[i], max_tokens))

        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(worker() for _ in range(clients)))
        finally:
            await client.close()
        return sorted(results, key=lambda r: r.index), time.perf_counter() - t0

    return asyncio.run(load())


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


@dataclass
class Run:
    """One timed load of a row on one side."""

    results: list[Streamed]
    wall_s: float
    load_1m: list[float]  # the machine's 1-minute load before and after it
    server_cpu_s: dict[str, float]  # CPU time of each server process (and children) during it


def figures(results: list[Streamed], wall_s: float) -> dict:
    """One side's figures: output tokens/s (completion tokens / wall), TTFT p50/p99, the gap
    between content chunks p50, and what shows every request was answered and streamed."""
    ok = [r for r in results if r.error is None and r.chunks > 0]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    gaps = [g for r in ok for g in r.gaps_s]
    chunks = [r.chunks for r in ok]
    return {
        "requests": len(results),
        "answered": len(ok),
        "errors": [r.error for r in results if r.error is not None][:3],
        "usage_reported": sum(r.completion_tokens is not None for r in ok),
        "completion_tokens": tokens,
        "wall_s": round(wall_s, 2),
        "output_tps": round(tokens / wall_s, 1) if wall_s > 0 else 0.0,
        "ttft_ms_p50": _ms(pct(ttft, 0.5)),
        "ttft_ms_p99": _ms(pct(ttft, 0.99)),
        "gap_ms_p50": _ms(pct(gaps, 0.5)),
        "gap_ms_p99": _ms(pct(gaps, 0.99)),
        "chunks_per_answer_min": min(chunks, default=0),
        "chunks_per_answer_median": statistics.median(chunks) if chunks else 0,
        "tokens_per_chunk": round(tokens / sum(chunks), 2) if chunks else None,
    }


def pooled(runs: list[Run]) -> dict:
    """A side's figures over every run of a row, taken as one long run (tokens over the summed
    wall time, percentiles over all requests), with each run's tokens/s and TTFT p50 (their
    spread), the machine's load around each, and the servers' CPU time per output token."""
    f = figures([r for run in runs for r in run.results], sum(run.wall_s for run in runs))
    cpu = {
        name: round(sum(run.server_cpu_s[name] for run in runs), 1) for name in runs[0].server_cpu_s
    }
    each = [figures(run.results, run.wall_s) for run in runs]
    return f | {
        "runs": [{"output_tps": e["output_tps"], "ttft_ms_p50": e["ttft_ms_p50"]} for e in each],
        "load_1m": [run.load_1m for run in runs],
        "server_cpu_s": cpu,
        "server_cpu_ms_per_token": (
            round(sum(cpu.values()) * 1000 / f["completion_tokens"], 1)
            if f["completion_tokens"]
            else None
        ),
    }


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the processes ``pids`` and all their descendants, so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def same_text_share(a: list[Run], b: list[Run]) -> float:
    """Share of prompts both sides answered with the same text (greedy decoding of the same
    weights: a check that both served the same adapter, not a target)."""
    pairs = [
        (x, y)
        for ra, rb in zip(a, b, strict=True)
        for x, y in zip(ra.results, rb.results, strict=True)
        if x.error is None and y.error is None
    ]
    return round(sum(x.text == y.text for x, y in pairs) / len(pairs), 3) if pairs else 0.0

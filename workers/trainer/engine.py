"""The multi-policy trainer: one resident base model, many policies' LoRA adapters and optimizers.

PEFT holds every policy as a named adapter on ONE ``PeftModel`` (``add_adapter`` /
``set_adapter``), so the base weights exist once however many policies train. All work on the
shared model (activate adapter → forward → backward → optimizer step, sampling, adding adapters)
runs on one compute thread, one call at a time; callers on any thread wait for their call while
everything else — waiting for rollouts, reading data, writing files — runs beside it, which is
how one policy trains while others wait. One compute thread also keeps tensor memory in one
malloc arena: steps spread over many threads grew RSS by ~12% here through per-thread arenas.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import torch
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalog.artifacts import model_fingerprint
from catalog.store import AdapterStore, StoredAdapter
from workers.trainer.config import TrainerConfig
from workers.trainer.data import Batch, collate, micro_batches
from workers.trainer.exceptions import BadBatch, PolicyNotLoaded
from workers.trainer.losses import (
    group_advantages,
    policy_gradient_loss,
    sft_loss,
)
from workers.trainer.policies import HeldPolicies
from workers.trainer.prefix import shared_prefix_logprobs
from workers.trainer.step_compute import StepCompute

if TYPE_CHECKING:
    from workers.trainer.rank_group import RankGroup

log = structlog.get_logger()


def _zero_grads(params: list[torch.nn.Parameter]) -> None:
    for p in params:
        p.grad = None


@dataclass(frozen=True)
class StepResult:
    loss: float
    tokens: int
    grad_norm: float
    metrics: dict[str, float]
    seconds: float


class MultiPolicyTrainer(HeldPolicies, StepCompute):
    """Train many policies' LoRA adapters over one resident base model (the policies it holds:
    :class:`~workers.trainer.policies.HeldPolicies`; step-level calls of the Tinker API:
    :class:`~workers.trainer.step_compute.StepCompute`)."""

    def __init__(self, config: TrainerConfig, store: AdapterStore | None = None) -> None:
        self.config = config
        self.store = store
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        dtype = getattr(torch, config.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(config.base_model)
        self.base = AutoModelForCausalLM.from_pretrained(config.base_model, dtype=dtype)
        self.base.requires_grad_(False)
        self.base.config.use_cache = False
        self.fingerprint = model_fingerprint(config.base_model)
        self.model: PeftModel | None = None
        super().__init__()
        self.ranks: RankGroup | None = None  # data-parallel ranks (RankedTrainer, ranks.py)
        self.lock = threading.RLock()  # guards the shared model: active adapter, fwd/bwd/step
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-compute")
        self._compute_ident = self._compute.submit(threading.get_ident).result()
        # Thread counts are per thread in torch's OpenMP pool: give the compute thread ours.
        self._compute.submit(torch.set_num_threads, torch.get_num_threads()).result()
        log.info(
            "trainer_ready",
            base_model=config.base_model,
            backend=config.backend,
            fingerprint=self.fingerprint,
        )

    def on_compute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the compute thread (directly if already there) and return its result."""
        if threading.get_ident() == self._compute_ident:
            with self.lock:
                return fn(*args, **kwargs)
        return self._compute.submit(self.on_compute, fn, *args, **kwargs).result()

    def close(self) -> None:
        self._compute.shutdown(wait=True)

    def base_parameter_ptrs(self) -> set[int]:
        """Storage addresses of the base weights (tests check no copy appears)."""
        return {p.data_ptr() for n, p in self.base.named_parameters() if "lora_" not in n}

    # Forward passes.

    def logits(self, policy_id: str, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        return self.on_compute(self._logits, policy_id, input_ids, attention_mask)

    def _logits(self, policy_id: str, input_ids: torch.Tensor, attention_mask) -> torch.Tensor:
        with torch.no_grad():
            self.activate(policy_id)
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _logprobs(self, batch: Batch) -> torch.Tensor:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return shared_prefix_logprobs(
            self.model, batch.input_ids, batch.attention_mask, batch.loss_mask, pad
        )

    # Steps.

    def sft_step(self, policy_id: str, batch: Batch, lr: float) -> StepResult:
        return self._step(policy_id, batch, lr, objective="sft")

    def rl_step(self, policy_id: str, batch: Batch, lr: float) -> StepResult:
        if batch.rewards is None or batch.groups is None:
            raise BadBatch("an RL step needs rollouts with reward and group")
        return self._step(policy_id, batch, lr, objective="rl")

    def _step(self, policy_id: str, batch: Batch, lr: float, objective: str) -> StepResult:
        return self.on_compute(self._compute_step, policy_id, batch, lr, objective)

    def _compute_step(self, policy_id: str, batch: Batch, lr: float, objective: str):
        """One optimizer step over ``batch``, in micro-batches of whole GRPO groups so that peak
        memory follows ``micro_batch_rows``, not the batch (the gradient is the same)."""
        t0 = time.perf_counter()
        state = self.activate(policy_id)
        # A step is a use: LRU by use, not by insert. (Only calls every rank makes reorder, so
        # data-parallel ranks evict alike; logits and sampling are reads for tests.)
        self.policies.move_to_end(policy_id)
        self.model.train()
        _zero_grads(state.params)  # this policy's only: others may hold accumulated gradients
        rows = self.config.micro_batch_rows if state.backend.accumulates else None
        total, tokens = batch.loss_mask.sum().clamp(min=1), batch.tokens
        adv = None
        if objective == "rl":
            cfg = self.config.loss
            adv = group_advantages(batch.rewards, batch.groups, cfg.normalize_std)
            reward_mean = float(batch.rewards.mean())
        scale = 1  # N data-parallel ranks (ranks.py): each runs its rows; DeepSpeed averages the
        if self.ranks is not None:  # ranks' gradients, so a rank's share of the mean counts N×
            batch, adv, scale = self.ranks.share(batch, adv)
        loss_value, metrics = 0.0, {}
        for idx in micro_batches(batch, rows):
            sub = batch.select(idx)
            weight = float(sub.loss_mask.sum() / total)  # a token-weighted share of the mean
            logprobs = self._logprobs(sub)
            part: dict[str, float] = {}
            if objective == "sft":
                loss = sft_loss(logprobs, sub.loss_mask)
            else:
                old = sub.old_logprobs if sub.old_logprobs is not None else logprobs.detach()
                loss, part = policy_gradient_loss(
                    logprobs, old, adv[idx], sub.loss_mask, cfg.rl_loss, cfg.clip_eps
                )
            if not (torch.isfinite(loss) if self.ranks is None else self.ranks.all_finite(loss)):
                _zero_grads(state.params)
                raise BadBatch(
                    f"{objective} loss is {float(loss)} for policy {policy_id!r}; "
                    "check rewards and logprobs for NaN/Inf"
                )
            state.backend.backward(loss * weight * scale)
            loss_value += float(loss.detach()) * weight
            for k, v in part.items():
                metrics[k] = metrics.get(k, 0.0) + v * weight
        if self.ranks is not None:
            loss_value, metrics = self.ranks.sum(loss_value, metrics)
        if objective == "rl":
            metrics["reward_mean"] = reward_mean
        grad_norm = state.backend.step(lr)
        self.model.eval()
        state.steps += 1
        state.losses.append(loss_value)
        return StepResult(loss_value, tokens, grad_norm, metrics, time.perf_counter() - t0)

    def collate(self, examples: list, add_eos: bool = True) -> Batch:
        return collate(self.tokenizer, examples, self.config.max_seq_len, add_eos=add_eos)

    # Sampling (tests, toy RL and the benchmark; production rollouts come from vLLM workers).

    def sample(
        self,
        policy_id: str,
        prompts: list[str],
        n: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[dict[str, Any]]:
        """``n`` samples per prompt with each sampled token's logprob under the policy."""
        return self.on_compute(
            self._sample, policy_id, prompts, n, max_new_tokens, temperature, seed
        )

    def _sample(self, policy_id, prompts, n, max_new_tokens, temperature, seed):
        rows = []
        with torch.no_grad():
            self.activate(policy_id)
            gen = torch.Generator().manual_seed(seed) if seed is not None else None
            for gi, prompt in enumerate(prompts):
                ids = torch.tensor([self.tokenizer(prompt).input_ids] * n)
                tokens = []
                cur = ids
                past = None
                logps = []
                for _ in range(max_new_tokens):
                    out = self.model(
                        input_ids=cur if past is None else cur[:, -1:],
                        past_key_values=past,
                        use_cache=True,
                    )
                    past = out.past_key_values
                    logits = out.logits[:, -1].float() / temperature
                    probs = torch.softmax(logits, dim=-1)
                    nxt = torch.multinomial(probs, 1, generator=gen)
                    logps.append(torch.log_softmax(logits, -1).gather(-1, nxt))
                    tokens.append(nxt)
                    cur = torch.cat([cur, nxt], dim=1)
                comp = torch.cat(tokens, dim=1)
                lp = torch.cat(logps, dim=1)
                for j in range(n):
                    rows.append(
                        {
                            "prompt": prompt,
                            "prompt_ids": ids[j].tolist(),
                            "completion_ids": comp[j].tolist(),
                            "logprobs": lp[j].tolist(),
                            "group": gi,
                        }
                    )
        return rows

    # Export.

    def write_adapter(self, policy_id: str, out: Path) -> Path:
        """Write the policy's adapter as a stock PEFT directory (no adapter-name subfolder)."""

        def snapshot():
            state = self.policy(policy_id)
            # LoRA tensors only: with lm_head targeted, PEFT's default would add the base
            # lm_head weight, which a MinT revision (and the store) refuses.
            sd = get_peft_model_state_dict(
                self.model, adapter_name=state.adapter, save_embedding_layers=False
            )
            tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in sd.items()}
            return tensors, self.model.peft_config[state.adapter]

        tensors, config = self.on_compute(snapshot)
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
        inference = config.inference_mode
        config.inference_mode = True  # what PEFT writes on save; loaders expect it
        try:
            config.save_pretrained(str(out))
        finally:
            config.inference_mode = inference
        return out

    def export(
        self, policy_id: str, tenant: str, policy: str, training: dict[str, Any] | None = None
    ) -> StoredAdapter:
        """Store the policy's current adapter as a new revision; it becomes the next parent."""
        if self.store is None:
            raise PolicyNotLoaded("this trainer has no adapter store; pass store= to export")
        state = self.policy(policy_id)
        tmp = Path(tempfile.mkdtemp(prefix="mint-export-"))
        try:
            self.write_adapter(policy_id, tmp)
            stored = self.store.put(
                tmp,
                tenant=tenant,
                policy=policy,
                base_model=self.config.base_model,
                base_model_fingerprint=self.fingerprint,
                parent=state.parent,
                parent_revision=state.parent_revision,
                training={"steps_total": state.steps, **(training or {})},
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        state.parent = stored
        return stored

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

import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import torch
from peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalog.artifacts import model_fingerprint
from catalog.exceptions import AdapterCorrupted
from catalog.packed import read_peft_weights
from catalog.store import AdapterStore, StoredAdapter
from workers.trainer import evicted
from workers.trainer.backends import Backend, DeepSpeedBackend, TorchBackend
from workers.trainer.config import TrainerConfig
from workers.trainer.data import Batch, collate, micro_batches
from workers.trainer.exceptions import BadBatch, PolicyNotLoaded, UntrainableTarget
from workers.trainer.losses import (
    group_advantages,
    policy_gradient_loss,
    sft_loss,
)
from workers.trainer.prefix import shared_prefix_logprobs

if TYPE_CHECKING:
    from workers.trainer.ranks import RankGroup

log = structlog.get_logger()


@dataclass
class LoraShape:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    target_parameters: list[str] = field(default_factory=list)

    def peft_config(self, base_model: str) -> LoraConfig:
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules) or None,
            target_parameters=list(self.target_parameters) or None,
            base_model_name_or_path=base_model,
            bias="none",
        )


# Modules the LM loss never reaches: DSA's lightning indexer feeds attention only through its
# top-k *indices*, so a LoRA there would stay at its init (workers/trainer/README.md, DSA).
NO_GRADIENT_SCOPES = ("indexer",)


def _check_trainable(base: torch.nn.Module, lora: LoraShape) -> None:
    """Refuse targets that would never train, naming them, instead of exporting dead weights."""
    dead = sorted(
        name
        for name, _ in base.named_modules()
        if any(name == t or name.endswith("." + t) for t in lora.target_modules)
        and any(scope in name.split(".")[:-1] for scope in NO_GRADIENT_SCOPES)
    )
    if dead:
        raise UntrainableTarget(
            f"target_modules {sorted(lora.target_modules)} reach {len(dead)} DSA indexer "
            f"projections (e.g. {dead[0]}), which get no gradient from the LM loss (the indexer "
            "selects keys by top-k indices); leave the indexer out of target_modules"
        )


@dataclass
class PolicyState:
    """One policy held by the trainer: its adapter name in the PEFT model and its optimizer."""

    policy_id: str
    adapter: str
    lora: LoraShape
    backend: Backend
    params: list[torch.nn.Parameter]
    steps: int = 0
    parent: StoredAdapter | None = None
    parent_revision: int | None = None
    losses: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class PolicySnapshot:
    """A policy's trainable weights and optimizer state at one moment (restore after failure)."""

    of: PolicyState  # the held state it was taken of (a reloaded policy is another)
    params: list[torch.Tensor]
    optimizer: dict[str, Any] | None
    steps: int
    losses: int
    parent: StoredAdapter | None
    parent_revision: int | None


@dataclass(frozen=True)
class StepResult:
    loss: float
    tokens: int
    grad_norm: float
    metrics: dict[str, float]
    seconds: float


def _adapter_name(policy_id: str) -> str:
    # PEFT adapter names become attribute keys: no '/' or '.'.
    return "p_" + re.sub(r"[^A-Za-z0-9_]", "_", policy_id)


class MultiPolicyTrainer:
    """Train many policies' LoRA adapters over one resident base model."""

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
        self.policies: OrderedDict[str, PolicyState] = OrderedDict()
        self._evicted: dict[str, tuple] = {}  # evicted state when there is no store
        self.ranks: RankGroup | None = None  # data-parallel ranks (RankedTrainer, ranks.py)
        self.lock = threading.RLock()  # guards the shared model: active adapter, fwd/bwd/step
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-compute")
        self._compute_ident = self._compute.submit(threading.get_ident).result()
        # Thread counts are per thread in torch's OpenMP pool: give the compute thread ours.
        self._compute.submit(torch.set_num_threads, torch.get_num_threads()).result()
        log.info("trainer_ready", base_model=config.base_model, backend=config.backend,
                 fingerprint=self.fingerprint)  # fmt: skip

    def on_compute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the compute thread (directly if already there) and return its result."""
        if threading.get_ident() == self._compute_ident:
            with self.lock:
                return fn(*args, **kwargs)
        return self._compute.submit(self.on_compute, fn, *args, **kwargs).result()

    def close(self) -> None:
        self._compute.shutdown(wait=True)

    # Policies.

    def base_parameter_ptrs(self) -> set[int]:
        """Storage addresses of the base weights (tests check no copy appears)."""
        return {p.data_ptr() for n, p in self.base.named_parameters() if "lora_" not in n}

    def add_policy(
        self,
        policy_id: str,
        lora: LoraShape | None = None,
        parent: StoredAdapter | None = None,
        parent_revision: int | None = None,
        seed: int | None = None,
    ) -> PolicyState:
        """Create (or, with ``parent``, resume from a stored revision) a policy's adapter."""
        return self.on_compute(self._add_policy, policy_id, lora, parent, parent_revision, seed)

    def _add_policy(self, policy_id, lora, parent, parent_revision, seed) -> PolicyState:
        if policy_id in self.policies:
            self.policies.move_to_end(policy_id)
            return self.policies[policy_id]
        while len(self.policies) >= self.config.max_policies:
            self._evict(next(iter(self.policies)))
        name = _adapter_name(policy_id)
        if parent is not None:
            m = parent.manifest
            lora = LoraShape(m.rank, m.lora_alpha, 0.0, m.target_modules, m.target_parameters)
        lora = lora or LoraShape()
        if seed is not None:
            torch.manual_seed(seed)  # LoRA A init is random: a seed makes runs repeatable
        if parent is None:
            _check_trainable(self.base, lora)
        if parent is not None:
            self._load_parent(name, parent)
        elif self.model is None:
            self.model = get_peft_model(
                self.base, lora.peft_config(self.config.base_model), adapter_name=name
            )
        else:
            self.model.add_adapter(name, lora.peft_config(self.config.base_model))
        self.model.set_adapter(name)
        params = [p for n, p in self.model.named_parameters() if f".{name}." in n]
        for p in params:
            p.requires_grad_(True)
        if self.config.backend == "deepspeed":
            backend: Backend = DeepSpeedBackend(self.model, params, self.config)
        else:
            backend = TorchBackend(params, self.config)
        state = PolicyState(policy_id, name, lora, backend, params, parent=parent,
                            parent_revision=parent_revision)  # fmt: skip
        self.policies[policy_id] = state
        self._resume_evicted(state)
        log.info("policy_added", policy=policy_id, adapter=name, rank=lora.rank,
                 trainable=sum(p.numel() for p in params),
                 parent=parent.digest if parent else None)  # fmt: skip
        return state

    def _load_parent(self, name: str, parent: StoredAdapter) -> None:
        """Load a stored revision as adapter ``name``: a MoE revision's tensors from its packed
        file (catalog/packed.py, rebuilt into PEFT's layout), any other through stock PEFT."""
        weights = read_peft_weights(parent.path)
        if weights is None:
            if self.model is None:
                self.model = PeftModel.from_pretrained(
                    self.base, str(parent.path), adapter_name=name, is_trainable=True
                )
            else:
                self.model.load_adapter(str(parent.path), adapter_name=name, is_trainable=True)
            return
        config = LoraConfig.from_pretrained(str(parent.path))
        config.inference_mode = False  # what from_pretrained(is_trainable=True) does
        if self.model is None:
            self.model = get_peft_model(self.base, config, adapter_name=name)
        else:
            self.model.add_adapter(name, config)
        result = set_peft_model_state_dict(self.model, weights, adapter_name=name)
        missing = [k for k in result.missing_keys if "lora_" in k and f".{name}." in k]
        if missing or result.unexpected_keys:
            raise AdapterCorrupted(
                f"packed file of {parent.uri} does not fit the model: missing {missing[:3]}, "
                f"unexpected {result.unexpected_keys[:3]}; re-export the revision"
            )

    def _evict(self, policy_id: str) -> None:
        """Drop the least recently used policy, saving what no revision holds: its weights
        (unexported steps) and optimizer state, to the store (or memory without one)."""
        state = self.policies[policy_id]
        optimizer = state.backend.optimizer_state()
        if optimizer is not None:
            params = [p.detach().clone() for p in state.params]
            meta = {"parent_revision": state.parent_revision, "steps": state.steps,
                    "shapes": [list(p.shape) for p in params]}  # fmt: skip
            if self.store is not None and evicted.storable(policy_id):
                evicted.save(self.store, policy_id, params, optimizer, meta)
            else:
                self._evicted[policy_id] = (params, optimizer, meta)
        self._remove_policy(policy_id)
        log.info("policy_evicted", policy=policy_id, saved=optimizer is not None)

    def _resume_evicted(self, state: PolicyState) -> None:
        """Continue an evicted policy exactly where it was, if it returns at the same revision."""
        pid = state.policy_id
        saved = self._evicted.pop(pid, None)
        if saved is None and self.store is not None and evicted.storable(pid):
            saved = evicted.load(self.store, pid)
            evicted.discard(self.store, pid)
        if saved is None:
            return
        params, optimizer, meta = saved
        if meta["parent_revision"] != state.parent_revision or meta["shapes"] != [
            list(p.shape) for p in state.params
        ]:
            log.info("evicted_state_stale", policy=pid, saved_at=meta["parent_revision"],
                     now_at=state.parent_revision)  # fmt: skip
            return
        with torch.no_grad():
            for p, value in zip(state.params, params, strict=True):
                p.copy_(value)
        state.backend.load_optimizer_state(optimizer)
        state.steps = meta["steps"]
        log.info("policy_resumed_after_eviction", policy=pid, steps=state.steps)

    def remove_policy(self, policy_id: str) -> None:
        self.on_compute(self._remove_policy, policy_id)

    def _remove_policy(self, policy_id: str) -> None:
        state = self.policies.pop(policy_id)
        assert self.model is not None
        self.model.delete_adapter(state.adapter)
        log.info("policy_removed", policy=policy_id)

    def snapshot(self, policy_id: str) -> PolicySnapshot | None:
        """The policy's weights and optimizer state now (None: not held)."""
        return self.on_compute(self._snapshot, policy_id)

    def _snapshot(self, policy_id: str) -> PolicySnapshot | None:
        state = self.policies.get(policy_id)
        if state is None:
            return None
        return PolicySnapshot(state, [p.detach().clone() for p in state.params],
                              state.backend.optimizer_state(), state.steps, len(state.losses),
                              state.parent, state.parent_revision)  # fmt: skip

    def restore(self, policy_id: str, snap: PolicySnapshot | None) -> None:
        """Put the policy back exactly as in ``snap`` (weights, optimizer, counters). Without a
        restorable snapshot the policy is dropped, so the next request reloads it from its
        stored revision rather than train on half-updated weights."""
        self.on_compute(self._restore, policy_id, snap)

    def _restore(self, policy_id: str, snap: PolicySnapshot | None) -> None:
        state = self.policies.get(policy_id)
        if state is None:
            return
        if snap is None or snap.optimizer is None or snap.of is not state:
            self._remove_policy(policy_id)
            log.warning("policy_dropped_after_failure", policy=policy_id)
            return
        with torch.no_grad():
            for p, saved in zip(state.params, snap.params, strict=True):
                p.copy_(saved)
                p.grad = None
        state.backend.load_optimizer_state(snap.optimizer)
        state.steps, state.parent, state.parent_revision = (
            snap.steps,
            snap.parent,
            snap.parent_revision,
        )
        del state.losses[snap.losses :]
        log.info("policy_restored_after_failure", policy=policy_id, steps=state.steps)

    def policy(self, policy_id: str) -> PolicyState:
        try:
            return self.policies[policy_id]
        except KeyError:
            raise PolicyNotLoaded(
                f"policy {policy_id!r} is not loaded in this trainer (holding "
                f"{list(self.policies)}); call add_policy first"
            ) from None

    def activate(self, policy_id: str) -> PolicyState:
        """Make ``policy_id``'s adapter the active one (caller holds the lock)."""
        state = self.policy(policy_id)
        assert self.model is not None
        if self.model.active_adapter != state.adapter:
            self.model.set_adapter(state.adapter)
        return state

    # Forward passes.

    def logits(self, policy_id: str, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        return self.on_compute(self._logits, policy_id, input_ids, attention_mask)

    def _logits(self, policy_id: str, input_ids: torch.Tensor, attention_mask) -> torch.Tensor:
        with torch.no_grad():
            self.activate(policy_id)
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _logprobs(self, batch: Batch) -> torch.Tensor:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return shared_prefix_logprobs(self.model, batch.input_ids, batch.attention_mask,
                                      batch.loss_mask, pad)  # fmt: skip

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
        self.model.train()
        self.model.zero_grad(set_to_none=True)
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
                loss, part = policy_gradient_loss(logprobs, old, adv[idx], sub.loss_mask,
                                                  cfg.rl_loss, cfg.clip_eps)  # fmt: skip
            if not (torch.isfinite(loss) if self.ranks is None else self.ranks.all_finite(loss)):
                self.model.zero_grad(set_to_none=True)
                raise BadBatch(f"{objective} loss is {float(loss)} for policy {policy_id!r}; "
                               "check rewards and logprobs for NaN/Inf")  # fmt: skip
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
        return self.on_compute(self._sample, policy_id, prompts, n, max_new_tokens, temperature,
                               seed)  # fmt: skip

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
                    out = self.model(input_ids=cur if past is None else cur[:, -1:],
                                     past_key_values=past, use_cache=True)  # fmt: skip
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
                    rows.append({
                        "prompt": prompt,
                        "prompt_ids": ids[j].tolist(),
                        "completion_ids": comp[j].tolist(),
                        "logprobs": lp[j].tolist(),
                        "group": gi,
                    })  # fmt: skip
        return rows

    # Export.

    def write_adapter(self, policy_id: str, out: Path) -> Path:
        """Write the policy's adapter as a stock PEFT directory (no adapter-name subfolder)."""

        def snapshot():
            state = self.policy(policy_id)
            # LoRA tensors only: with lm_head targeted, PEFT's default would add the base
            # lm_head weight, which a MinT revision (and the store) refuses.
            sd = get_peft_model_state_dict(self.model, adapter_name=state.adapter,
                                           save_embedding_layers=False)  # fmt: skip
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

    def export(self, policy_id: str, tenant: str, policy: str,
               training: dict[str, Any] | None = None) -> StoredAdapter:  # fmt: skip
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

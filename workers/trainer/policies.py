"""The policies one trainer holds: each a named LoRA adapter on the trainer's one ``PeftModel``.

A policy is added fresh or from a stored revision, kept in least-recently-used order up to
``max_policies``, evicted with what no revision holds (unexported steps, optimizer state) saved
to the store and resumed when it returns at the same revision, pinned while an update is in
flight, and snapshot and restored around a failed update. :class:`HeldPolicies` is the part of
:class:`~workers.trainer.engine.MultiPolicyTrainer` that does this; every call that touches the
model runs on the trainer's compute thread (``on_compute``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

from catalog.exceptions import AdapterCorrupted
from catalog.packed import read_peft_weights
from catalog.store import AdapterStore, StoredAdapter
from workers.trainer import evicted
from workers.trainer.backends import Backend, DeepSpeedBackend, TorchBackend
from workers.trainer.config import TrainerConfig
from workers.trainer.exceptions import AdapterExists, PolicyNotLoaded, UntrainableTarget

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
    # forward_backward calls whose gradients wait for an optim_step (steps.py; in memory only).
    accumulated: int = 0
    # A policy trained by step-level calls (steps.py): its shape and replay position, saved
    # with its state; such a saved state stays in the store when resumed (it is the checkpoint
    # a restarted trainer resumes from), where an evicted update policy's is discarded.
    step_meta: dict[str, Any] | None = None


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


def _adapter_name(policy_id: str) -> str:
    """A digest of the policy id: injective (a character map made ``acme/x-p`` and ``acme-x/p``
    one adapter, so two tenants shared weights) and a valid attribute key ([A-Za-z0-9_]), as
    PEFT adapter names must be. Nothing persists it: evicted/step state stores parameters by
    position, and exports strip the name (get_peft_model_state_dict), so renaming is safe."""
    return "p_" + hashlib.sha256(policy_id.encode()).hexdigest()[:32]


class HeldPolicies:
    """The held policies of a :class:`~workers.trainer.engine.MultiPolicyTrainer`, which loads
    the base model, owns the compute thread and calls ``__init__`` here once the base is in."""

    # Provided by the trainer.
    config: TrainerConfig
    store: AdapterStore | None
    base: torch.nn.Module
    model: PeftModel | None
    on_compute: Callable[..., Any]

    def __init__(self) -> None:
        self.policies: OrderedDict[str, PolicyState] = OrderedDict()  # least recently used first
        self._pinned: dict[str, int] = {}  # policy id -> updates in flight (never evicted)
        self._pins_guard = threading.Lock()
        self._evicted: dict[str, tuple] = {}  # evicted state when there is no store
        # Called with a policy id after its eviction (on the compute thread: keep them cheap),
        # so what others keep per policy (steps.py's remembered answers) goes with it.
        self.evict_listeners: list[Callable[[str], None]] = []

    @contextmanager
    def updating(self, policy_id: str) -> Iterator[None]:
        """Pin ``policy_id`` for an update: another thread's ``add_policy`` never evicts it
        (which would save half-updated weights that the retry resumes from and trains again)
        until the update finished or was rolled back to its start. Pin before it is added."""
        self.pin(policy_id)
        try:
            yield
        finally:
            self.unpin(policy_id)

    def pin(self, policy_id: str) -> None:
        """Never evict ``policy_id`` until as many ``unpin`` calls (pins count): an update in
        flight, or gradients accumulated by step-level calls, which eviction does not save."""
        with self._pins_guard:
            self._pinned[policy_id] = self._pinned.get(policy_id, 0) + 1

    def unpin(self, policy_id: str) -> None:
        with self._pins_guard:
            left = self._pinned.pop(policy_id, 0) - 1
            if left > 0:
                self._pinned[policy_id] = left

    def add_policy(
        self,
        policy_id: str,
        lora: LoraShape | None = None,
        parent: StoredAdapter | None = None,
        parent_revision: int | None = None,
        seed: int | None = None,
    ) -> PolicyState:
        """Create (or, with ``parent``, resume from a stored revision) a policy's adapter."""
        return self.on_compute(self._add_unpinned, policy_id, lora, parent, parent_revision, seed)

    def _add_unpinned(self, *args: Any) -> PolicyState:
        # Pins read and evictions made under one guard: an update that pins its policy either
        # came first (never evicted) or finds it gone and reloads it. The pins go along as an
        # argument so that data-parallel ranks (ranks.py) make the same evictions.
        with self._pins_guard:
            return self._add_policy(*args, frozenset(self._pinned))

    def _add_policy(
        self, policy_id, lora, parent, parent_revision, seed, pinned: frozenset[str] = frozenset()
    ) -> PolicyState:
        if policy_id in self.policies:
            self.policies.move_to_end(policy_id)
            return self.policies[policy_id]
        while len(self.policies) >= self.config.max_policies:
            victim = next((pid for pid in self.policies if pid not in pinned), None)
            if victim is None:  # all in the middle of updates: over the bound until one ends
                log.warning(
                    "every held policy is being updated: holding more than max_policies",
                    held=len(self.policies),
                    max_policies=self.config.max_policies,
                )
                break
            self._evict(victim)
        name = _adapter_name(policy_id)
        if parent is not None:
            m = parent.manifest
            lora = LoraShape(m.rank, m.lora_alpha, 0.0, m.target_modules, m.target_parameters)
        lora = lora or LoraShape()
        if seed is not None:
            torch.manual_seed(seed)  # LoRA A init is random: a seed makes runs repeatable
        if parent is None:
            _check_trainable(self.base, lora)
        if self.model is not None and name in self.model.peft_config:
            # PEFT's load_adapter (and set_peft_model_state_dict) would load a parent INTO the
            # resident adapter: two policies would share its weights. Never: refuse.
            raise AdapterExists(
                f"adapter {name!r} of policy {policy_id!r} is already in the model but not held "
                "as that policy; restart the trainer to clear it"
            )
        try:
            if parent is not None:
                self._load_parent(name, parent)
            elif self.model is None:
                self.model = get_peft_model(
                    self.base, lora.peft_config(self.config.base_model), adapter_name=name
                )
            else:
                self.model.add_adapter(name, lora.peft_config(self.config.base_model))
        except BaseException:
            # Half-added (a corrupt parent): leave no adapter behind that no policy owns.
            if self.model is not None and name in self.model.peft_config:
                self.model.delete_adapter(name)
            raise
        self.model.set_adapter(name)
        params = [p for n, p in self.model.named_parameters() if f".{name}." in n]
        for p in params:
            p.requires_grad_(True)
        if self.config.backend == "deepspeed":
            backend: Backend = DeepSpeedBackend(self.model, params, self.config)
        else:
            backend = TorchBackend(params, self.config)
        state = PolicyState(
            policy_id, name, lora, backend, params, parent=parent, parent_revision=parent_revision
        )
        self.policies[policy_id] = state
        self._resume_evicted(state)
        log.info(
            "policy_added",
            policy=policy_id,
            adapter=name,
            rank=lora.rank,
            trainable=sum(p.numel() for p in params),
            parent=parent.digest if parent else None,
        )
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
            meta = {
                "parent_revision": state.parent_revision,
                "steps": state.steps,
                "shapes": [list(p.shape) for p in params],
            }
            if state.step_meta is not None:
                meta["step"] = state.step_meta
            if self.store is not None and evicted.storable(policy_id):
                evicted.save(self.store, policy_id, params, optimizer, meta)
            else:
                self._evicted[policy_id] = (params, optimizer, meta)
        self._remove_policy(policy_id)
        log.info("policy_evicted", policy=policy_id, saved=optimizer is not None)
        for listener in self.evict_listeners:
            listener(policy_id)

    def _resume_evicted(self, state: PolicyState) -> None:
        """Continue an evicted policy exactly where it was, if it returns at the same revision."""
        pid = state.policy_id
        saved = self._evicted.pop(pid, None)
        if saved is None and self.store is not None and evicted.storable(pid):
            saved = evicted.load(self.store, pid)
            if saved is not None and "step" not in saved[2]:
                evicted.discard(self.store, pid)
        if saved is None:
            return
        params, optimizer, meta = saved
        if meta["parent_revision"] != state.parent_revision or meta["shapes"] != [
            list(p.shape) for p in state.params
        ]:
            log.info(
                "evicted_state_stale",
                policy=pid,
                saved_at=meta["parent_revision"],
                now_at=state.parent_revision,
            )
            return
        with torch.no_grad():
            for p, value in zip(state.params, params, strict=True):
                p.copy_(value)
        state.backend.load_optimizer_state(optimizer)
        state.steps, state.step_meta = meta["steps"], meta.get("step")
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
        return PolicySnapshot(
            state,
            [p.detach().clone() for p in state.params],
            state.backend.optimizer_state(),
            state.steps,
            len(state.losses),
            state.parent,
            state.parent_revision,
        )

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

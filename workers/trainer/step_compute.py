"""Step-level compute for the Tinker API: forward (and backward) over datums, and the optimizer
step, on one held policy. :class:`StepCompute` is the part of
:class:`~workers.trainer.engine.MultiPolicyTrainer` that workers/trainer/steps.py calls; like
every call on the shared model it runs on the trainer's compute thread (``on_compute``).

Gradients of ``forward_datums(backward=True)`` ADD to the policy's ``.grad`` until
``optim_step`` applies and clears them. They live in memory only: steps.py pins the policy
while any wait, since eviction saves weights and optimizer state but not gradients.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from workers.trainer.backends import TorchBackend
from workers.trainer.exceptions import BackendError, BadBatch
from workers.trainer.losses import step_loss
from workers.trainer.policies import PolicyState

if TYPE_CHECKING:
    from workers.trainer.config import TrainerConfig
    from workers.trainer.rank_group import RankGroup

# Padded tokens per forward of a step-level call: logits are tokens x vocab floats, so memory
# follows this, not the call's size (up to schemas.events.steps.MAX_STEP_TOKENS).
STEP_BATCH_TOKENS = 2048
# Logprobs answered are at least this: a -inf (a token the model gives no mass at all) cannot be
# published (JSON has no Inf), and below it exp() is 0 in float64 already, so nothing is lost.
LOGPROB_FLOOR = -1e4
# exp(x) overflows float32 above ~88.7: the log-ratio past which an importance weight is Inf.
_RATIO_OVERFLOW = 88.0


class NonFiniteGradients(BadBatch):
    """Gradients with NaN or Inf: never added to a policy's, never applied."""


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """One device sync: the max |value| of each is finite iff every value is (NaN propagates)."""
    return bool(torch.isfinite(torch.stack([t.detach().abs().amax() for t in tensors])).all())


def _token_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive rows, each batch at most ``budget`` padded tokens (a longer row alone)."""
    batches: list[list[int]] = []
    for i, n in enumerate(lengths):
        last = batches[-1] if batches else None
        if last and (len(last) + 1) * max(n, *(lengths[j] for j in last)) <= budget:
            last.append(i)
        else:
            batches.append([i])
    return batches


def _check_step_backend(trainer: StepCompute, state: PolicyState) -> TorchBackend:
    if trainer.ranks is not None or not isinstance(state.backend, TorchBackend):
        raise BackendError(
            "step-level training calls run on one rank of the torch backend; this trainer runs "
            f"{trainer.config.backend} on {trainer.ranks.world if trainer.ranks else 1} rank(s): "
            "send them to a torch trainer (mint worker trainer --backend torch)"
        )
    return state.backend


class StepCompute:
    """Step-level calls of a :class:`~workers.trainer.engine.MultiPolicyTrainer`."""

    # Provided by the trainer.
    config: TrainerConfig
    base: torch.nn.Module
    model: Any
    tokenizer: Any
    ranks: RankGroup | None
    policies: OrderedDict[str, PolicyState]
    on_compute: Callable[..., Any]
    activate: Callable[[str], PolicyState]
    policy: Callable[[str], PolicyState]

    def vocab_size(self) -> int:
        """Token ids the model takes and scores: below this."""
        out = self.base.get_output_embeddings()
        sizes = [self.base.get_input_embeddings().num_embeddings]
        return min(sizes + ([out.out_features] if out is not None else []))

    def forward_datums(
        self, policy_id: str, datums: list, loss_fn: str, config: dict, backward: bool
    ) -> tuple[float, list[list[float]], int]:
        """(loss summed over datums, per-datum per-position logprobs of ``target_tokens``,
        tokens). With ``backward`` the gradients are ADDED to the policy's accumulated ones."""
        return self.on_compute(self._forward_datums, policy_id, datums, loss_fn, config, backward)

    def _forward_datums(self, policy_id, datums, loss_fn, config, backward):
        state = self.activate(policy_id)
        _check_step_backend(self, state)
        device = next(self.base.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # A failed call leaves the accumulated gradients as they were before it.
        grads = [None if p.grad is None else p.grad.clone() for p in state.params]
        total, logprobs = 0.0, []
        gap = (float("-inf"), -1)  # the largest log π − log π_sampler, and its datum
        self.model.train(backward)
        try:
            for rows in _token_batches([len(d.tokens) for d in datums], STEP_BATCH_TOKENS):
                part = [datums[i] for i in rows]
                n = max(len(d.tokens) for d in part)
                ids = torch.full((len(part), n), pad, dtype=torch.long)
                targets = torch.zeros((len(part), n), dtype=torch.long)
                mask = torch.zeros((len(part), n), dtype=torch.long)
                for j, d in enumerate(part):
                    ids[j, : len(d.tokens)] = torch.tensor(d.tokens)
                    targets[j, : len(d.tokens)] = torch.tensor(d.target_tokens)
                    mask[j, : len(d.tokens)] = 1
                with torch.set_grad_enabled(backward):
                    logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device))
                    logp = torch.log_softmax(logits.logits.float(), dim=-1)
                    logp = logp.gather(-1, targets.to(device)[..., None]).squeeze(-1)
                    loss = logp.new_zeros(())
                    for j, d in enumerate(part):
                        lp = logp[j, : len(d.tokens)]
                        inputs = {
                            k: torch.tensor(getattr(d, k), dtype=torch.float32, device=device)
                            for k in ("weights", "logprobs", "advantages", "sequence_ratio_mask")
                            if getattr(d, k) is not None
                        }
                        loss = loss + step_loss(loss_fn, lp, inputs, config)
                        if "logprobs" in inputs and loss_fn != "cross_entropy":
                            g = float((lp.detach() - inputs["logprobs"]).max())
                            gap = max(gap, (g, rows[j]))
                        logprobs.append(lp.detach().clamp(min=LOGPROB_FLOOR).cpu().tolist())
                    if not torch.isfinite(loss):
                        raise BadBatch(
                            f"{loss_fn} loss is {float(loss.detach())}: "
                            + _cause(
                                loss_fn,
                                gap,
                                "check the datums' logprobs, advantages and weights for NaN/Inf",
                            )
                        )
                    if backward:
                        loss.backward()
                total += float(loss.detach())
            if not math.isfinite(total):  # finite parts, an overflowing sum
                raise BadBatch(f"{loss_fn} loss summed over the datums is {total}: send fewer")
            grads_now = [p.grad for p in state.params if p.grad is not None]
            if backward and grads_now and not _all_finite(grads_now):
                raise NonFiniteGradients(_non_finite_reason(loss_fn, total, gap))
        except BaseException:
            for p, g in zip(state.params, grads, strict=True):
                p.grad = g
            raise
        finally:
            self.model.eval()
        if backward:
            state.accumulated += 1
            self.policies.move_to_end(policy_id)  # a use (LRU)
        return total, logprobs, sum(len(d.tokens) for d in datums)

    def optim_step(self, policy_id: str, adam: dict[str, float]) -> dict[str, float]:
        """AdamW on the accumulated gradients with ``adam`` (AdamSpec's fields), then zero them."""
        return self.on_compute(self._optim_step, policy_id, adam)

    def _optim_step(self, policy_id: str, adam: dict[str, float]) -> dict[str, float]:
        state = self.policy(policy_id)
        backend = _check_step_backend(self, state)
        calls = state.accumulated
        if all(p.grad is None for p in state.params):
            return {"grad_norm": 0.0, "accumulated_calls": 0.0, "stepped": 0.0}
        for p in state.params:  # a parameter the loss never reached: a zero gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in state.params])))
        if not math.isfinite(norm):
            # AdamW would write NaN into the weights and its moments (and the checkpoint):
            # nothing is applied, and the gradients, useless now, are dropped.
            self._drop_gradients(policy_id)
            raise NonFiniteGradients(
                f"the gradient norm of {calls} accumulated forward_backward call(s) is {norm}; "
                "nothing was applied (weights and optimizer state are as they were) and those "
                "gradients were dropped: send the forward_backward calls again (with finite, "
                "moderate inputs), then optim_step"
            )
        before = backend.clip, [dict(g) for g in backend.optimizer.param_groups]
        for group in backend.optimizer.param_groups:
            group.update(
                betas=(adam["beta1"], adam["beta2"]),
                eps=adam["eps"],
                weight_decay=adam["weight_decay"],
            )
        backend.clip = adam["grad_clip_norm"]
        try:
            grad_norm = backend.step(adam["learning_rate"])  # zeroes this policy's gradients
        finally:  # the update path's steps keep the trainer's own hyperparameters
            backend.clip = before[0]
            for group, saved in zip(backend.optimizer.param_groups, before[1], strict=True):
                group.update(betas=saved["betas"], eps=saved["eps"])
                group.update(weight_decay=saved["weight_decay"])
        state.steps += 1
        state.accumulated = 0
        self.policies.move_to_end(policy_id)
        return {"grad_norm": grad_norm, "accumulated_calls": float(calls), "stepped": 1.0}

    def drop_gradients(self, policy_id: str) -> None:
        """Forget the policy's accumulated gradients (idle too long, or not finite)."""
        self.on_compute(self._drop_gradients, policy_id)

    def _drop_gradients(self, policy_id: str) -> None:
        state = self.policy(policy_id)
        for p in state.params:
            p.grad = None
        state.accumulated = 0


def _cause(loss_fn: str, gap: tuple[float, int], otherwise: str) -> str:
    if gap[0] <= _RATIO_OVERFLOW:
        return otherwise
    return (
        f"likely a {loss_fn} ratio overflow: in datums[{gap[1]}] a sampler logprob is "
        f"{gap[0]:.1f} below the current policy's, and exp() of more than "
        f"{_RATIO_OVERFLOW:.0f} is Inf in float32; send the sampler's own logprobs of these "
        "target tokens (or leave out datums sampled from another policy)"
    )


def _non_finite_reason(loss_fn: str, loss: float, gap: tuple[float, int]) -> str:
    return (
        f"{loss_fn} gradients are not finite (NaN/Inf) although the loss is {loss:.6g}; "
        "nothing was added to the policy's gradients: "
        + _cause(loss_fn, gap, "check the datums' inputs for extreme values")
    )

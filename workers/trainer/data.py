"""Training examples (SFT pairs, RL rollouts) and their conversion to padded tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import torch
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from workers.trainer.exceptions import BadBatch


class SftExample(BaseModel):
    """A prompt and the completion to learn (text, or token ids when the caller tokenized).

    Also reads the rollout workers' rows (``workers.serving.rollout``): ``prompt_token_ids``,
    ``token_ids`` and ``prompt_index`` are accepted for ``prompt_ids``, ``completion_ids`` and
    ``group``.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    prompt: str = ""
    completion: str = ""
    prompt_ids: list[int] | None = Field(
        None, validation_alias=AliasChoices("prompt_ids", "prompt_token_ids")
    )
    completion_ids: list[int] | None = Field(
        None, validation_alias=AliasChoices("completion_ids", "token_ids")
    )

    @model_validator(mode="after")
    def _has_completion(self) -> Self:
        if not self.completion and not self.completion_ids:
            raise ValueError("an SFT example needs completion (text) or completion_ids")
        return self


class Rollout(SftExample):
    """One sampled completion with its reward, its group (prompt) and its sampling logprobs."""

    reward: float
    group: str | int = Field(
        description="samples of one prompt share a group",
        validation_alias=AliasChoices("group", "prompt_index"),
    )
    logprobs: list[float] | None = Field(
        None, description="log π_rollout of each completion token; None: on-policy (ratio 1)"
    )


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    loss_mask: torch.Tensor  # (B, T-1): 1 where position t-1 predicts a completion token t
    old_logprobs: torch.Tensor | None = None  # (B, T-1), aligned with loss_mask
    rewards: torch.Tensor | None = None  # (B,)
    groups: torch.Tensor | None = None  # (B,)

    @property
    def tokens(self) -> int:
        return int(self.loss_mask.sum())

    def select(self, idx: torch.Tensor) -> Batch:
        """The rows ``idx`` (a micro-batch), every tensor indexed alike."""
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return Batch(
            self.input_ids[idx],
            self.attention_mask[idx],
            self.loss_mask[idx],
            pick(self.old_logprobs),
            pick(self.rewards),
            pick(self.groups),
        )


def micro_batches(batch: Batch, max_rows: int | None) -> list[torch.Tensor]:
    """Row indices of micro-batches of at most ``max_rows`` rows, never splitting a group (its
    rows share a prompt, run once by the shared-prefix forward); a larger group stays whole.
    ``None``: the whole batch."""
    n = batch.input_ids.shape[0]
    if max_rows is None or n <= max_rows:
        return [torch.arange(n)]
    groups = batch.groups if batch.groups is not None else torch.arange(n)
    chunks: list[list[int]] = [[]]
    for g in dict.fromkeys(groups.tolist()):
        members = (groups == g).nonzero().flatten().tolist()
        if chunks[-1] and len(chunks[-1]) + len(members) > max_rows:
            chunks.append([])
        chunks[-1].extend(members)
    return [torch.tensor(c) for c in chunks]


def _ids(tokenizer: Any, ex: SftExample, add_eos: bool) -> tuple[list[int], list[int]]:
    prompt = ex.prompt_ids if ex.prompt_ids is not None else tokenizer(ex.prompt).input_ids
    if ex.completion_ids is not None:
        completion = list(ex.completion_ids)
    else:
        completion = tokenizer(ex.completion, add_special_tokens=False).input_ids
        if add_eos:
            completion = completion + [tokenizer.eos_token_id]
    if not prompt:
        prompt = [tokenizer.bos_token_id]
    return list(prompt), completion


def collate(
    tokenizer: Any, examples: list[SftExample], max_len: int, add_eos: bool = True
) -> Batch:
    """Right-padded tensors; prompts are not learned, completions are."""
    if not examples:
        raise BadBatch("the batch is empty; give at least one example")
    rows, masks, olds = [], [], []
    for i, ex in enumerate(examples):
        prompt, completion = _ids(tokenizer, ex, add_eos)
        ids = (prompt + completion)[:max_len]
        n_prompt = min(len(prompt), len(ids))
        n_comp = len(ids) - n_prompt
        if n_comp == 0:
            raise BadBatch(
                f"example {i}: prompt of {len(prompt)} tokens fills max_seq_len={max_len}; "
                "shorten the prompt or raise max_seq_len"
            )
        rows.append(ids)
        masks.append([0] * (n_prompt - 1) + [1] * n_comp)
        if isinstance(ex, Rollout) and ex.logprobs is not None:
            if len(ex.logprobs) != len(completion):
                raise BadBatch(
                    f"rollout {i}: {len(ex.logprobs)} logprobs for {len(completion)} completion "
                    "tokens; send one logprob per sampled token (and completion_ids)"
                )
            olds.append([0.0] * (n_prompt - 1) + list(ex.logprobs[:n_comp]))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    old = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for i, (ids, m) in enumerate(zip(rows, masks, strict=True)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        if olds:
            old[i, : len(olds[i])] = torch.tensor(olds[i])
    batch = Batch(input_ids, attention, loss_mask)
    if examples and isinstance(examples[0], Rollout):
        rollouts: list[Rollout] = examples  # type: ignore[assignment]
        if olds and len(olds) != len(rollouts):
            raise BadBatch("give logprobs for every rollout of a batch or for none")
        batch.old_logprobs = old if olds else None
        batch.rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
        names = {g: k for k, g in enumerate(dict.fromkeys(str(r.group) for r in rollouts))}
        batch.groups = torch.tensor([names[str(r.group)] for r in rollouts])
    return batch


def parse_examples(rows: list[dict[str, Any]], objective: str) -> list[SftExample]:
    model = Rollout if objective == "rl" else SftExample
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(model.model_validate(row))
        except ValidationError as e:
            raise BadBatch(f"{objective} example {i} is invalid: {e}") from e
    return out

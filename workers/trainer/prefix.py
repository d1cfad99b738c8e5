"""Token log-probs of a batch whose rows share prompts, with each distinct prompt run once.

GRPO samples n completions per prompt, and a chat prompt is most of each sequence (SmolLM2's
template makes "What is 7 + 5? …" 44 tokens, completions are 2–12). Running every row whole
repeats the prompt n times, forward and backward. Here each distinct prompt is run once with
the KV cache kept (with its autograd graph), the cache is gathered to the rows that share it,
and only the completions run per row. The result, and its gradient, equal the plain forward
(``tests/unit/test_trainer_prefix.py``); measured on SmolLM2-135M with 16 prompts × 8 samples:
see the README's "Training on the real model".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from workers.trainer.losses import token_logprobs


def prompt_lengths(loss_mask: torch.Tensor) -> torch.Tensor:
    """Tokens before the first learned one, per row (``collate`` learns completions only)."""
    return loss_mask.argmax(dim=1) + 1


def plain_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """(B, T-1) log-probs of each next token; zero left of the first learned position.

    The LM head runs only from that position on: with a 49K vocabulary, full logits would
    dominate time and memory (128 rows × 57 tokens × 49K fp32 = 1.4 GB per copy).
    """
    learned = loss_mask.any(dim=0).nonzero()
    start = int(learned[0]) if len(learned) else 0
    keep = torch.arange(start, input_ids.shape[1])  # logits at t predict t+1; the last unused
    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep)
    return F.pad(token_logprobs(out.logits, input_ids[:, start:]), (start, 0))


def shared_prefix_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    pad_id: int = 0,
) -> torch.Tensor:
    """Same result as :func:`plain_logprobs` for right-padded rows (``collate``'s layout)."""
    n_prompt = prompt_lengths(loss_mask).tolist()
    lengths = attention_mask.sum(dim=1).tolist()
    prefixes: dict[tuple[int, ...], int] = {}
    row_prefix = []
    for i, n in enumerate(n_prompt):
        row_prefix.append(prefixes.setdefault(tuple(input_ids[i, :n].tolist()), len(prefixes)))
    if len(prefixes) == len(n_prompt):  # nothing shared: the plain forward is cheaper
        return plain_logprobs(model, input_ids, attention_mask, loss_mask)
    width = input_ids.shape[1]
    by_len: dict[int, list[tuple[int, ...]]] = {}
    for p in prefixes:
        by_len.setdefault(len(p), []).append(p)
    rows_out: dict[int, torch.Tensor] = {}
    keys = list(prefixes)
    for n, group in by_len.items():
        slot = {prefixes[p]: k for k, p in enumerate(group)}
        rows = [i for i in range(len(n_prompt)) if len(keys[row_prefix[i]]) == n]
        pre = model(input_ids=torch.tensor(group), use_cache=True, logits_to_keep=1)
        cache = pre.past_key_values
        pick = torch.tensor([slot[row_prefix[i]] for i in rows])
        cache.reorder_cache(pick)  # index_select per layer: differentiable
        comp_len = max(lengths[i] - n for i in rows)
        comp = torch.full((len(rows), comp_len), pad_id, dtype=input_ids.dtype)
        comp_mask = torch.zeros((len(rows), n + comp_len), dtype=attention_mask.dtype)
        comp_mask[:, :n] = 1
        for k, i in enumerate(rows):
            c = lengths[i] - n
            comp[k, :c] = input_ids[i, n : lengths[i]]
            comp_mask[k, n : n + c] = 1
        out = model(input_ids=comp, attention_mask=comp_mask, past_key_values=cache, use_cache=True)
        # Logits predicting completion token j: the prompt's last position for j = 0, then the
        # completion's own positions 0 … C-2.
        logits = torch.cat([pre.logits[:, -1:][pick], out.logits[:, :-1]], dim=1)
        lp = F.log_softmax(logits.float(), dim=-1).gather(-1, comp[:, :, None]).squeeze(-1)
        for k, i in enumerate(rows):
            # Target t+1 = n + j sits at column n - 1 + j of the (B, T-1) layout.
            rows_out[i] = F.pad(lp[k], (n - 1, width - 1 - (n - 1) - comp_len))
    return torch.stack([rows_out[i] for i in range(len(n_prompt))])

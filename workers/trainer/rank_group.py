"""One process's place among data-parallel ranks and what a step exchanges with the others.

Apart from ranks.py (which starts and drives the ranks) so that the trainer's engine and step
code, which ranks.py builds on, can name the group without importing back up.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from workers.trainer.data import Batch


class RankGroup:
    """This process's place among ``world`` data-parallel ranks and what a step exchanges."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def share(
        self, batch: Batch, adv: torch.Tensor | None
    ) -> tuple[Batch, torch.Tensor | None, int]:
        """This rank's rows of ``batch`` (and advantages), and the factor of their loss.

        Whole groups (each row is one, for SFT) go to the ranks in order, ``world`` runs of
        about equal count; with fewer groups than ranks the rows are split evenly instead. A
        rank left without rows runs row 0 with nothing to learn (factor 0): it still joins the
        gradient reduce, which every rank must."""
        n = batch.input_ids.shape[0]
        groups = batch.groups if batch.groups is not None else torch.arange(n)
        order = torch.tensor(list(dict.fromkeys(groups.tolist())))
        if len(order) >= self.world:
            mine = torch.tensor_split(order, self.world)[self.rank]
            idx = torch.isin(groups, mine).nonzero().flatten()
        else:
            idx = torch.tensor_split(torch.arange(n), self.world)[self.rank]
        if len(idx) == 0:
            sub = batch.select(torch.tensor([0]))
            sub.loss_mask = torch.zeros_like(sub.loss_mask)
            return sub, None if adv is None else adv[:1], 0
        return batch.select(idx), None if adv is None else adv[idx], self.world

    def all_finite(self, loss: torch.Tensor) -> bool:
        """True when every rank's loss is finite (all ranks then go on to backward together)."""
        bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
        dist.all_reduce(bad)
        return float(bad) == 0.0

    def sum(self, value: float, metrics: dict[str, float]) -> tuple[float, dict[str, float]]:
        """The ranks' shares of the loss and metrics added up: the whole batch's."""
        keys = sorted(metrics)
        t = torch.tensor([value, *(metrics[k] for k in keys)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t[0]), {k: float(v) for k, v in zip(keys, t[1:].tolist(), strict=True)}

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def send(self, call: tuple[str, tuple]) -> None:
        dist.broadcast_object_list([call], src=0)

    def receive(self) -> tuple[str, tuple]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

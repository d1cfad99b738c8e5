"""Optimizer backends: plain torch AdamW (default) and DeepSpeed ZeRO-2.

Both own one policy's trainable LoRA parameters and its optimizer state; the base weights are
frozen and shared. The trainer computes the loss; a backend turns it into an update.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Protocol

import structlog
import torch

from workers.trainer.config import TrainerConfig
from workers.trainer.exceptions import BackendError

log = structlog.get_logger()


class Backend(Protocol):
    # True: backward() may be called once per micro-batch before step() (gradients add up).
    accumulates: bool

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` into the policy's gradients."""
        ...

    def step(self, lr: float) -> float:
        """Clip, take one AdamW step at ``lr``, clear the gradients; return the grad norm."""
        ...

    def optimizer_state(self) -> dict[str, Any] | None:
        """A copy of the optimizer state to restore after a failed update (None: cannot)."""
        ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...


class TorchBackend:
    def __init__(self, params: list[torch.nn.Parameter], config: TrainerConfig) -> None:
        self.params = params
        self.clip = config.grad_clip
        self.optimizer = torch.optim.AdamW(
            params, lr=1e-4, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
        )

    accumulates = True

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.params]))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def optimizer_state(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.optimizer.state_dict())

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(copy.deepcopy(state))


_DS_INITIALIZED = False


def init_distributed(port: int) -> None:
    """Join the process group once: the ranks from the torch.distributed environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; workers/trainer/ranks.py sets them), or
    one rank of its own (``MASTER_PORT`` = ``port``). gloo on CPU, NCCL on GPUs."""
    global _DS_INITIALIZED
    if _DS_INITIALIZED:
        return
    import deepspeed

    for key, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(port)),
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
    ):
        os.environ.setdefault(key, value)
    # DeepSpeed JIT-compiles a shared-memory op at init, used only by inference all-reduce,
    # which ZeRO training never calls. The build needs a compiler and holds a lock file under
    # ~/.cache/torch_extensions that a killed process leaves behind: every later init waited on
    # it forever (CI hung 25 minutes). Marking the op incompatible skips the build.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    _DS_INITIALIZED = True


class DeepSpeedBackend:
    """ZeRO stage 2 over one policy's LoRA parameters (optimizer states and grads partitioned).

    One DeepSpeed engine per policy over a container of only that policy's parameters: its
    optimizer and gradient hooks cover them alone, the base stays a single copy, and at start
    DeepSpeed broadcasts rank 0's copy of them (not the base) to the other data-parallel ranks
    (workers/trainer/ranks.py). The trainer runs the shared PEFT model itself.
    """

    def __init__(
        self, module: torch.nn.Module, params: list[torch.nn.Parameter], config: TrainerConfig
    ) -> None:
        try:
            import deepspeed
        except ImportError as e:
            raise BackendError(
                "backend='deepspeed' needs the train extra: pip install 'mint[train]'"
            ) from e
        init_distributed(config.deepspeed_port)
        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": config.grad_clip,
            "zero_optimization": {"stage": 2},
            "optimizer": {
                "type": "AdamW",
                "params": {
                    "lr": 1e-4,
                    "betas": list(config.betas),
                    "eps": config.eps,
                    "weight_decay": config.weight_decay,
                    "torch_adam": True,
                },
            },
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        if config.dtype == "bfloat16":
            ds_config["bf16"] = {"enabled": True}
        from deepspeed.accelerator import get_accelerator

        # The device DeepSpeed would have moved its module to (this rank's; "cpu" on CPU).
        module.to(get_accelerator().device_name(int(os.environ.get("LOCAL_RANK", "0"))))
        try:
            self.engine, self.optimizer, _, _ = deepspeed.initialize(
                model=torch.nn.ParameterList(params), model_parameters=params, config=ds_config
            )
        except Exception as e:  # DeepSpeed raises bare Exceptions/asserts on bad setups
            raise BackendError(f"DeepSpeed ZeRO-2 initialization failed: {e}") from e

    # DeepSpeed counts micro-batches itself (gradient_accumulation_steps); one backward per step.
    accumulates = False

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def partition_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: its partition of the fp32 master weights
        and of AdamW's two moments (1/N of the policy's on N ranks, plus alignment padding)."""
        held = 0
        for part in self.optimizer.single_partition_of_fp32_groups:
            tensors = [part, *self.optimizer.optimizer.state.get(part, {}).values()]
            held += sum(t.numel() * t.element_size() for t in tensors if t.dim() > 0)
        return held

    def optimizer_state(self) -> dict[str, Any] | None:
        return None  # ZeRO keeps fp32 partitions beside the state: the trainer reloads instead

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("a DeepSpeed policy is reloaded from its revision instead")

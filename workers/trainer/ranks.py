"""DeepSpeed ZeRO-2 over N data-parallel ranks (``mint worker trainer --ranks N``).

Every rank is a process with its own copy of the resident base. Rank 0 is the trainer worker:
it alone consumes ``update.requests`` (the one consumer loop), exports and publishes. Each call
that changes the model — add a policy, drop one, take a step — rank 0 first sends to ranks
1..N-1 (``broadcast_object_list``), which make the same call on their copy in the same order, so
every rank holds the same policies and builds each policy's ZeRO-2 engine together with the
others: gradients are reduce-scattered and each rank keeps only its 1/N partition of the fp32
master weights and AdamW moments. A step's batch is split by whole GRPO groups (rows, for SFT);
each rank weights its loss by its share of the batch's learned tokens and by N (DeepSpeed
averages the ranks' gradients), so N ranks make the update one rank makes.

After each call the ranks compare outcomes: the same error everywhere (a bad batch) is that
call's error and they go on; a rank that died or failed alone leaves them out of step, which is
:class:`~workers.trainer.exceptions.RanksLost`: rank 0 sets ``stop`` and leaves its record
uncommitted, the followers exit. While idle, rank 0 pings every ``PING_S`` seconds, so a lost
follower is noticed and no follower's wait reaches the process group's timeout.

Ranks come from the standard torch.distributed environment (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``). Without ``RANK`` set, rank 0 starts ranks 1..N-1 on
this machine as child processes (``python -m workers.trainer.ranks``); with it (the
``deepspeed`` launcher and a hostfile, a Kubernetes Indexed Job), each process takes the rank
it was given and starts nothing. Followers read a parent revision from the same store path as
rank 0 (a shared volume across machines), and DeepSpeed then broadcasts rank 0's copy.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import torch
import torch.distributed as dist

from catalog.store import AdapterStore
from workers.trainer.backends import init_distributed
from workers.trainer.config import TrainerConfig
from workers.trainer.engine import MultiPolicyTrainer
from workers.trainer.exceptions import BackendError, RanksLost
from workers.trainer.rank_group import RankGroup

log = structlog.get_logger()

PING_S = 10.0  # rank 0 pings idle followers this often (the gloo timeout is 30 min)
ROOT = Path(__file__).resolve().parents[2]


def _every_rank(method: Callable[..., Any]) -> Callable[..., Any]:
    """Rank 0 sends the call to the other ranks first; every rank makes it, then all compare
    outcomes. A call made inside another (eviction inside add_policy) is not sent again."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: RankedTrainer, *args: Any) -> Any:
        if self._depth:
            return method(self, *args)
        if self.lost:
            raise RanksLost(self.lost)
        if self.ranks.rank == 0:
            try:
                self.ranks.send((name, args))
            except Exception as e:  # gloo: "Connection closed by peer" when a follower died
                raise self._lose(f"{name}: sending it to the other ranks failed: {e}") from e
        self._depth += 1
        error: Exception | None = None
        try:
            result = method(self, *args)
        except Exception as e:
            error, result = e, None
        finally:
            self._depth -= 1
        mine = None if error is None else (type(error).__name__, str(error)[:500])
        try:
            outcomes = self.ranks.gather(mine)
        except Exception as e:  # a rank died during the call (or before answering)
            here = "ok" if mine is None else ": ".join(mine)
            raise self._lose(f"{name}: the ranks did not all answer ({e}); here: {here}") from e
        if len({o and o[0] for o in outcomes}) > 1:  # error types (None: ok) differ
            told = "; ".join(
                f"rank {r}: {': '.join(o) if o else 'ok'}" for r, o in enumerate(outcomes)
            )
            raise self._lose(f"{name}: the ranks fell out of step ({told})") from error
        if error is not None:
            raise error  # every rank failed alike: that call's error; the ranks stay in step
        return result

    return call


class RankedTrainer(MultiPolicyTrainer):
    """A :class:`MultiPolicyTrainer` on one of N data-parallel ranks (DeepSpeed ZeRO-2).

    Callers use rank 0's, as they use a one-rank trainer; ranks 1..N-1 run :meth:`follow`.
    ``followers`` are the processes of ranks this process started (watched; stopped on close).
    """

    def __init__(
        self,
        config: TrainerConfig,
        group: RankGroup,
        store: AdapterStore | None = None,
        stop: threading.Event | None = None,
        followers: list[subprocess.Popen] | None = None,
    ) -> None:
        if config.backend != "deepspeed":
            raise BackendError(
                f"{group.world} ranks need backend='deepspeed' (got {config.backend!r}): only "
                "ZeRO-2 partitions across ranks; use --backend deepspeed or --ranks 1"
            )
        self.stop = stop or threading.Event()
        self.followers = followers or []
        self.lost: str | None = None
        self._depth = 0
        self._closed = threading.Event()
        self._ready = False
        if self.followers:
            threading.Thread(target=self._watch, name="trainer-ranks-watch", daemon=True).start()
        super().__init__(config, store)
        self.ranks: RankGroup = group
        self.on_compute(init_distributed, config.deepspeed_port)  # meets the other ranks here
        self._ready = True
        log.info("trainer_rank_ready", rank=group.rank, world=group.world, pid=os.getpid())
        if group.rank == 0 and group.world > 1:
            threading.Thread(target=self._ping_loop, name="trainer-ranks-ping", daemon=True).start()

    # The calls every rank makes (rank 0 sends them; see _every_rank).

    @_every_rank
    def _add_policy(self, *args: Any) -> Any:
        return super()._add_policy(*args)

    @_every_rank
    def _remove_policy(self, *args: Any) -> Any:
        return super()._remove_policy(*args)

    @_every_rank
    def _compute_step(self, *args: Any) -> Any:
        return super()._compute_step(*args)

    @_every_rank
    def _ping(self) -> None:
        pass

    @_every_rank
    def _optimizer_bytes(self, policy_id: str) -> list[int]:
        return self.ranks.gather(self.policy(policy_id).backend.partition_bytes())

    def optimizer_bytes(self, policy_id: str) -> list[int]:
        """Bytes of the policy's optimizer state each rank holds (its ZeRO-2 partition)."""
        return self.on_compute(self._optimizer_bytes, policy_id)

    # Ranks 1..N-1.

    def follow(self) -> None:
        """Make rank 0's calls, in its order, until it says stop. Raises RanksLost when rank 0
        is gone or the ranks fell out of step."""
        while True:
            try:
                name, args = self.ranks.receive()
            except RuntimeError as e:
                raise RanksLost(f"rank 0 is gone ({e})") from e
            if name == "stop":
                log.info("trainer_rank_stopping", rank=self.ranks.rank)
                return
            try:
                self.on_compute(getattr(self, name), *args)
            except RanksLost:
                raise
            except Exception as e:  # every rank failed alike; rank 0 reports it
                log.info("rank_call_failed_everywhere", call=name, error=f"{type(e).__name__}: {e}")

    # Losing ranks, pings, shutdown.

    def _lose(self, reason: str) -> RanksLost:
        if self.lost is None:
            self.lost = reason
            log.error(
                "trainer_ranks_lost",
                rank=self.ranks.rank if self._ready else 0,
                reason=reason,
                fix="see the other ranks' logs, then restart",
            )
            self.stop.set()
        return RanksLost(self.lost)

    def _watch(self) -> None:
        """Rank 0: notice a follower process that exits before it was told to stop."""
        while not self._closed.wait(0.5):
            for rank, proc in enumerate(self.followers, start=1):
                code = proc.poll()
                if code is None:
                    continue
                self._lose(f"rank {rank} (pid {proc.pid}) exited with code {code}")
                if not self._ready:  # still meeting the others: nothing else would end the wait
                    for other in self.followers:
                        other.kill()
                    os._exit(1)
                return

    def _ping_loop(self) -> None:
        while not self._closed.wait(PING_S):
            try:
                self.on_compute(self._ping)
            except Exception:  # RanksLost (logged), or the compute thread shut down
                return

    def close(self) -> None:
        self._closed.set()
        if self.ranks.rank == 0 and self.lost is None and self.ranks.world > 1:
            try:
                self.on_compute(self.ranks.send, ("stop", ()))
            except Exception as e:
                log.warning("trainer_ranks_stop_failed", error=str(e))
        for rank, proc in enumerate(self.followers, start=1):
            try:
                proc.wait(timeout=5 if self.lost else 60)
            except subprocess.TimeoutExpired:
                log.warning("trainer_rank_killed", rank=rank, pid=proc.pid)
                proc.kill()
                proc.wait()
        super().close()
        if dist.is_initialized():
            dist.destroy_process_group()


def launched_rank() -> int | None:
    """The rank a launcher gave this process (env ``RANK``), or None: start the ranks here."""
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None else None


def _launched_group(ranks: int) -> RankGroup:
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world != ranks:
        raise BackendError(
            f"--ranks {ranks} but the launcher set WORLD_SIZE={world}; give the same count to both"
        )
    return RankGroup(int(os.environ["RANK"]), world)


def start(
    config: TrainerConfig,
    ranks: int,
    store: AdapterStore | None = None,
    stop: threading.Event | None = None,
) -> RankedTrainer:
    """Rank 0 of ``ranks``. Without a launcher (no ``RANK`` in the environment) it starts ranks
    1..N-1 on this machine as child processes (``MASTER_PORT`` from the environment, else
    ``config.deepspeed_port``); on CPU each rank then gets cores/N torch threads."""
    if launched_rank() is not None:
        group = _launched_group(ranks)
        if group.rank != 0:
            raise BackendError(f"start() is rank 0's; this process is rank {group.rank}: follow()")
        return RankedTrainer(config, group, store, stop)
    if config.backend != "deepspeed":
        raise BackendError(f"{ranks} ranks need backend='deepspeed' (got {config.backend!r})")
    if config.torch_threads is None and not torch.cuda.is_available():
        config = config.model_copy(update={"torch_threads": max(1, (os.cpu_count() or 1) // ranks)})
    port = os.environ.get("MASTER_PORT", str(config.deepspeed_port))
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "WORLD_SIZE": str(ranks),
        "MINT_TRAINER_RANK0_PID": str(os.getpid()),
    }
    # Their own session: a terminal's Ctrl-C reaches rank 0 alone, which then stops them.
    followers = [
        subprocess.Popen(
            [sys.executable, "-m", "workers.trainer.ranks", "--config", config.model_dump_json()],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            cwd=ROOT,
            start_new_session=True,
        )
        for rank in range(1, ranks)
    ]
    os.environ.update({k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")})
    os.environ.update(RANK="0", LOCAL_RANK="0")
    log.info("trainer_ranks_started", world=ranks, pids=[p.pid for p in followers])
    try:
        return RankedTrainer(config, RankGroup(0, ranks), store, stop, followers)
    except BaseException:
        for proc in followers:
            proc.kill()
        raise


def follow(config: TrainerConfig, ranks: int | None = None) -> None:
    """Ranks 1..N-1 (``RANK`` from the environment): follow rank 0 until it stops."""
    group = _launched_group(ranks or int(os.environ["WORLD_SIZE"]))
    parent = os.environ.get("MINT_TRAINER_RANK0_PID")
    if parent is not None:  # started by rank 0 on this machine: go when it goes
        threading.Thread(target=_exit_with, args=(int(parent),), daemon=True).start()
    structlog.contextvars.bind_contextvars(rank=group.rank)
    trainer = RankedTrainer(config, group)
    try:
        trainer.follow()
    finally:
        trainer.close()


def _exit_with(pid: int) -> None:
    while os.getppid() == pid:
        time.sleep(1.0)
    os._exit(1)


def main() -> None:
    from schemas.logs import configure_logging
    from schemas.settings import get_settings

    ap = argparse.ArgumentParser(description="a follower rank of the DeepSpeed trainer")
    ap.add_argument("--config", required=True, help="TrainerConfig as JSON")
    args = ap.parse_args()
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    try:
        follow(TrainerConfig.model_validate_json(args.config))
    except RanksLost as e:
        raise SystemExit(f"trainer rank {os.environ.get('RANK')}: {e}") from None


if __name__ == "__main__":
    main()

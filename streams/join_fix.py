"""A fix for kafka-python 3.0.12's group join, applied once where streams makes its clients.

``BaseCoordinator.join_group_async`` runs each JoinGroup/SyncGroup round as a task and waits for
it only as long as the caller's ``poll(timeout_ms)``. When the task finishes between two polls,
the next poll throws its result away: it starts a new round for a task that ``is_done``, and when
nothing else asks for a rejoin (a leader's rejoin for changed metadata is satisfied by the round
itself) it skips the loop altogether. The member then stays ``REBALANCING`` with heartbeats off
and its assignment never applied; the broker drops it after the session and its polls return
nothing for good. Seen in CI twice in one day: a multi-engine test's engine and the
``serving_vs_vllm`` smoke's only engine (the stall watch's ``no_join`` said: state rebalancing,
rejoining, join task done). An engine polls 100 ms at a time, so a round that outlasts a poll on
a loaded machine is common.

The fix, two changes marked ``MinT:``: a finished round is consumed by the next poll (its
assignment applied, or its error handled as the library handles it), never replaced; and
``need_rejoin`` stays true while a join is under way (the consumer's poll calls
``ensure_active_group`` only when it says so), so a round that failed is tried again even when
no error's side effect asked for it. ``join_group_async`` is otherwise the library's own.
"""

from __future__ import annotations

import kafka
import structlog
from kafka import errors as Errors
from kafka.coordinator import base
from kafka.structs import MemberState
from kafka.util import Timer

log = structlog.get_logger()

FIXED_VERSIONS = ("3.0.12",)  # checked against this version's source; others are left alone


async def join_group_async(self, timeout_ms=None):
    if not self._use_group_apis:
        raise Errors.UnsupportedVersionError("Group Coordinator APIs require 0.9+ broker")
    timer = Timer(timeout_ms)
    while self.need_rejoin():  # true while a round is pending (need_rejoin, below)
        if not await self.ensure_coordinator_ready_async(timeout_ms=timer.timeout_ms):
            return False
        # MinT: a finished round is awaited below (its result at once), not replaced.
        if self._join_task is None:
            if not self.rejoining:
                await self._on_join_prepare_async(
                    self._generation.generation_id,
                    self._generation.member_id,
                    timeout_ms=timer.timeout_ms,
                )
                self.rejoining = True
                self._disable_heartbeat()
            self._join_task = self._manager.call_soon(self._do_join_and_sync_async)
        try:
            assignment_bytes = await self._manager.wait_for(self._join_task, timer.timeout_ms)
        except Errors.KafkaTimeoutError:
            return False  # still running: the next poll awaits the same round
        except (
            Errors.UnknownMemberIdError,
            Errors.RebalanceInProgressError,
            Errors.IllegalGenerationError,
            Errors.MemberIdRequiredError,
        ):
            self._join_task = None
            continue
        except Errors.RetriableError:
            self._join_task = None
            if timer.expired:
                return False
            backoff_ms = self.config["retry_backoff_ms"]
            if timer.timeout_ms is not None:
                backoff_ms = min(backoff_ms, timer.timeout_ms)
            if backoff_ms > 0:
                await self._manager._net.sleep(backoff_ms / 1000)
            continue
        except Errors.KafkaError:
            self._join_task = None
            raise
        self._join_task = None
        with self._lock:
            self.rejoining = False
            self.rejoin_needed = False
            self.state = MemberState.STABLE
            self._enable_heartbeat()
        await self._on_join_complete_async(
            self._generation.generation_id,
            self._generation.member_id,
            self._generation.protocol,
            assignment_bytes,
        )
        return True
    return True


def need_rejoin(self) -> bool:
    # MinT: a join under way (prepared, its round pending, finished but not applied, or failed
    # and to be tried again) still needs the poll's ensure_active_group, whatever asked for it.
    return self.rejoin_needed or self.rejoining or self._join_task is not None


def apply() -> bool:
    """Install the fix (once); False where this kafka-python is not the version it was made for."""
    if getattr(base.BaseCoordinator.join_group_async, "_mint_fixed", False):
        return True
    if kafka.__version__ not in FIXED_VERSIONS:
        log.warning(
            "kafka-python join fix not applied: made for another version",
            installed=kafka.__version__,
            fixed=FIXED_VERSIONS,
        )
        return False
    join_group_async._mint_fixed = True  # type: ignore[attr-defined]
    base.BaseCoordinator.join_group_async = join_group_async
    base.BaseCoordinator.need_rejoin = need_rejoin
    return True

"""Workers.report's thread dumps, condensed so that a CI log shows where each thread waits."""

from __future__ import annotations

from mint.dev.workers import split_stacks

SITE = "/v/.venv/lib/python3.11/site-packages"


def waiting(header: str) -> str:
    """One thread of a faulthandler dump: an engine's poll waiting for its coordinator."""
    frames = [
        '"/usr/lib/python3.11/threading.py", line 320 in wait',
        f'"{SITE}/kafka/net/selector.py", line 330 in run',
        f'"{SITE}/kafka/coordinator/base.py", line 339 in ensure_coordinator_ready',
        f'"{SITE}/kafka/coordinator/consumer.py", line 403 in poll',
        f'"{SITE}/kafka/consumer/group.py", line 844 in _poll_once',
        '"/repo/streams/polling.py", line 34 in poll_records',
        '"/repo/workers/serving/worker.py", line 315 in step',
    ]
    return "\n".join([f"{header} (most recent call first):", *(f"  File {f}" for f in frames)])


LOG = f"""{{"event": "partitions assigned"}}
{waiting("Thread 0x00007f01")}

{{"event": "a line between two dumps"}}
{waiting("Current thread 0x00007f02")}

Thread 0x00007f03 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
"""


def test_the_last_dump_is_condensed_to_where_each_thread_waits_and_our_own_frames() -> None:
    before, stacks = split_stacks(LOG, frames=2)
    assert before.endswith('{"event": "a line between two dumps"}\n')  # the first dump is log
    assert stacks.splitlines() == [
        "Current thread 0x00007f02 (most recent call first):",
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
        f'  File "{SITE}/kafka/net/selector.py", line 330 in run',
        "  …",
        '  File "/repo/streams/polling.py", line 34 in poll_records',
        '  File "/repo/workers/serving/worker.py", line 315 in step',
        "Thread 0x00007f03 (most recent call first):",
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
    ]


def test_a_log_without_a_dump_is_left_whole() -> None:
    assert split_stacks('{"event": "x"}\n') == ('{"event": "x"}\n', "")


def test_the_broker_lines_are_those_that_name_the_run(tmp_path) -> None:
    from mint.dev.workers import broker_lines
    from schemas.settings import MintSettings

    settings = MintSettings(state_dir=tmp_path, topic_prefix="svv1a2b3c")
    assert "no local broker log: FileNotFoundError" in broker_lines(settings)
    log = tmp_path / "kafka" / "logs" / "server.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "[t] INFO Preparing to rebalance group svv1a2b3c-serving (reason: new member)\n"
        "[t] INFO Preparing to rebalance group other-serving\n"
        "[t] INFO Member svv-engine left group svv1a2b3c-serving\n"
    )
    assert broker_lines(settings).splitlines() == [
        "===== kafka (lines naming svv1a2b3c) =====",
        "[t] INFO Preparing to rebalance group svv1a2b3c-serving (reason: new member)",
        "[t] INFO Member svv-engine left group svv1a2b3c-serving",
    ]

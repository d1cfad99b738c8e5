"""One CLI error decorator: what MinT raises on purpose is one `error: …` line and exit 1, a usage
error is click's exit 2, a bug keeps its traceback; every command a person runs wears it."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from kafka.errors import KafkaConfigurationError

from catalog.cluster import CassandraUnavailable
from catalog.exceptions import InvalidReference
from mint.cli import main
from mint.commands.clients import carried_out_later, sending
from mint.commands.errors import one_line_errors
from mint.dev.launcher import LauncherError
from mint.sdk import WaitTimeout
from schemas.exceptions import EventValidationError, MintError
from streams.exceptions import KafkaUnavailable, PublishError
from workers.models.exceptions import ModelBuildError


def _run(error: BaseException, *also: type[BaseException]):
    @click.command()
    @(one_line_errors(*also) if also else one_line_errors)
    def cmd() -> None:
        raise error

    return CliRunner().invoke(cmd, [])


@pytest.mark.parametrize(
    "error",
    [
        InvalidReference("'Acme' is not a tenant name: use lowercase letters"),
        CassandraUnavailable("no Cassandra node at 127.0.0.1:1: start one with `mint dev up`"),
        KafkaUnavailable("no Kafka broker at 127.0.0.1:1: start one with `mint dev up`"),
        WaitTimeout("no eval.completed within 60 s"),
        ModelBuildError("unknown arch 'gpt'"),
        LauncherError("Java 17 or newer is required"),
        EventValidationError("payload.revision: must be ≥ 1"),
        NotADirectoryError(20, "Not a directory", "/tmp/file/sub"),
        KafkaConfigurationError("unrecognized configs: foo"),
    ],
)
def test_mint_os_and_kafka_errors_are_one_line_and_exit_1(error: BaseException) -> None:
    result = _run(error)
    assert result.exit_code == 1, result.output
    assert result.output == f"error: {error}\n"


def test_markup_in_a_message_is_printed_as_it_is() -> None:
    result = _run(InvalidReference("bad name [bold]x[/bold] in [acme]"))
    assert result.output == "error: bad name [bold]x[/bold] in [acme]\n"


def test_a_long_message_stays_on_one_line() -> None:
    message = "no Kafka broker at 127.0.0.1:1: " + "x" * 300
    assert _run(KafkaUnavailable(message)).output == f"error: {message}\n"


def test_usage_errors_stay_clicks_with_exit_2() -> None:
    result = _run(click.UsageError("give --model DIR"))
    assert (
        result.exit_code == 2 and "Usage:" in result.output and "give --model DIR" in result.output
    )
    assert _run(click.UsageError("x"), RuntimeError).exit_code == 2  # click's, even when widened


def test_a_bug_keeps_its_traceback_and_extras_are_opt_in() -> None:
    bug = _run(KeyError("oops"))
    assert isinstance(bug.exception, KeyError)  # not swallowed into a line
    assert isinstance(_run(RuntimeError("refused ACLs")).exception, RuntimeError)
    widened = _run(RuntimeError("broker refused ACLs"), RuntimeError)
    assert (widened.exit_code, widened.output) == (1, "error: broker refused ACLs\n")


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


# Worker processes are not run by a person at a prompt: a crash keeps its traceback in the log.
WORKERS = "worker "


def test_every_command_a_person_runs_wears_the_decorator() -> None:
    bare = [
        path
        for path, command in _commands(main)
        if not path.startswith(WORKERS) and not hasattr(command.callback, "one_line_errors")
    ]
    assert bare == [], f"add @one_line_errors (mint/commands/errors.py) to: {bare}"


def test_a_secrets_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    # Before: `mint security secrets` had no handler and printed a NotADirectoryError traceback.
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(main, ["security", "secrets", "--dir", str(tmp_path / "file/s")])
    assert result.exit_code == 1 and result.output.startswith("error: "), result.output
    assert "Traceback" not in result.output and "Not a directory" in result.output


def test_mint_version_prints_the_package_version() -> None:
    from mint import __version__

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"mint {__version__}\n"


def test_a_broker_that_refuses_the_login_is_not_called_absent() -> None:
    """kafka-python says only "Unable to bootstrap" for both; the port tells them apart."""
    import socket

    from kafka.errors import KafkaTimeoutError

    from schemas.settings import MintSettings
    from streams.clients import _unavailable

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        there = MintSettings(kafka_bootstrap=f"127.0.0.1:{port}")
        e = _unavailable(there, KafkaTimeoutError("Unable to bootstrap"))
        assert str(e).startswith(f"Kafka at 127.0.0.1:{port} accepts connections but did not")
        assert "check the credentials and the protocol" in str(e)
    gone = _unavailable(there, KafkaTimeoutError("Unable to bootstrap"))
    assert str(gone).startswith(f"no Kafka broker at 127.0.0.1:{port}: start one")


def test_a_command_fails_at_once_where_no_broker_listens() -> None:
    """A one-shot command's client checks the port first rather than wait out kafka-python's
    30 s bootstrap timeout; one listening address of several is enough to go on."""
    import socket
    import time

    from schemas.settings import MintSettings
    from streams.clients import require_broker
    from streams.exceptions import KafkaUnavailable

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        require_broker(MintSettings(kafka_bootstrap=f"127.0.0.1:1,127.0.0.1:{port}"))
    t0 = time.monotonic()
    with pytest.raises(KafkaUnavailable, match=f"no Kafka broker at 127.0.0.1:{port}: start one"):
        require_broker(MintSettings(kafka_bootstrap=f"127.0.0.1:{port}"))
    assert time.monotonic() - t0 < 5.0


# A command that meets what the Cassandra driver logs with a traceback and then raises: a prepare
# refused (no keyspace) and a connect that found no node; the command words it as MinT's error.
_DRIVER_SCRIPT = """
import logging
from mint.cli import main
from mint.commands.clients import carried_out_later, sending
from mint.commands.errors import one_line_errors
from schemas.exceptions import MintError

@main.command("driver-fails")
@one_line_errors
def driver_fails():
    log = logging.getLogger("cassandra.cluster")
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except ConnectionRefusedError:
        log.warning("[control connection] Error connecting to %s:", "127.0.0.1:1", exc_info=True)
    try:
        raise ValueError('keyspace nope does not exist')
    except ValueError:
        log.exception("Error preparing query:")
    raise MintError("keyspace 'nope' does not exist: run `mint catalog migrate`")

main(["driver-fails"])
"""


def _driver_fails(level: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "MINT_LOG_LEVEL": level}
    return subprocess.run(
        [sys.executable, "-c", _DRIVER_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_cassandra_drivers_tracebacks_stay_off_the_terminal() -> None:
    # Before: `mint policies list demo` without the keyspace printed the driver's "Error preparing
    # query:" traceback above MinT's own error line.
    result = _driver_fails("INFO")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "Error preparing query" not in result.stderr
    assert result.stderr.endswith(
        "error: keyspace 'nope' does not exist: run `mint catalog migrate`\n"
    )
    # A record the driver does not raise keeps its line, with the error folded into it.
    assert (
        "WARNING cassandra.cluster [control connection] Error connecting to 127.0.0.1:1: "
        "ConnectionRefusedError: [Errno 111] Connection refused\n" in result.stderr
    )


def test_debug_logging_keeps_the_drivers_tracebacks() -> None:
    result = _driver_fails("DEBUG")
    assert result.returncode == 1 and result.stderr.count("Traceback") == 2, result.stderr


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (KafkaUnavailable("no broker"), "no broker; nothing was sent"),
        (PublishError("cut off"), "cut off; check `x` before sending it again"),
        (WaitTimeout("no answer in 1 s"), "no answer in 1 s later: `x` shows when"),
    ],
)
def test_a_command_that_sends_says_whether_it_was_sent(error: Exception, says: str) -> None:
    with (
        pytest.raises(MintError) as got,
        sending("nothing was sent", "check `x` before sending it again", "later: `x` shows when"),
    ):
        raise error
    assert str(got.value) == says and got.value.__suppress_context__


def test_without_words_for_a_late_answer_the_wait_timeout_stays() -> None:
    with pytest.raises(WaitTimeout), sending("nothing was sent", "maybe sent"):
        raise WaitTimeout("no answer in 1 s")
    assert carried_out_later("mint history a/b@prod").endswith("`mint history a/b@prod` shows when")

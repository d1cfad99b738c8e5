"""`mint infer` with a fake SDK client: vLLM's sampling and structured-output options reach
MintClient.infer, the answer alone goes to stdout, bad options are one clear line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

import mint.commands.inference as inference
from mint.cli import main
from schemas.events import InferCompleted
from schemas.events.sampling import TokenLogprob, TopLogprob

SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}


class FakeClient:
    def __init__(self, answer: InferCompleted) -> None:
        self.answer, self.calls = answer, []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def infer(self, policy: str, prompt: str, **kw: Any) -> InferCompleted:
        self.calls.append((policy, prompt, kw))
        return self.answer


def answer(text: str = '{"age": 31}', **kw: Any) -> InferCompleted:
    return InferCompleted(
        request_id="r1",
        revision=3,
        adapter_digest="sha256:" + "b" * 64,
        engine_id="e1",
        text=text,
        finish_reason="stop",
        prompt_tokens=4,
        completion_tokens=5,
        latency_ms=20.0,
        **kw,
    )


@pytest.fixture
def fake(monkeypatch):
    client = FakeClient(answer())
    seen: dict[str, Any] = {}

    def make(tenant: str, timeout_s: float) -> FakeClient:
        seen.update(tenant=tenant, timeout_s=timeout_s)
        return client

    monkeypatch.setattr(inference, "cli_client", make)
    client.seen = seen
    return client


def run(*args: str):
    return CliRunner().invoke(main, ["infer", *args])


def test_every_sampling_option_reaches_the_sdk(fake, tmp_path) -> None:
    schema_file = tmp_path / "age.json"
    schema_file.write_text(json.dumps(SCHEMA))
    r = run(
        "acme/extract@7",
        "Alice is 31.",
        "--chat",
        "--max-tokens=32",
        "--temperature=0.7",
        "--top-p=0.9",
        "--seed=5",
        "--top-k=40",
        "--min-p=0.05",
        "--repetition-penalty=1.1",
        "--presence-penalty=0.5",
        "--frequency-penalty=0.25",
        "--min-tokens=2",
        "--ignore-eos",
        "--stop=END",
        "--stop-token-id=2",
        "--stop-token-id=3",
        "--top-logprobs=3",
        f"--json-schema={schema_file}",
    )
    assert r.exit_code == 0, r.output
    assert r.stdout == '{"age": 31}\n'  # the answer alone on stdout: `| jq` works
    ((policy, prompt, kw),) = fake.calls
    assert (policy, prompt, fake.seen["tenant"]) == ("extract", "Alice is 31.", "acme")
    assert kw["revision"] == 7 and kw["chat"] and kw["max_tokens"] == 32
    assert (kw["temperature"], kw["top_p"], kw["seed"], kw["stop"]) == (0.7, 0.9, 5, ("END",))
    s = kw["sampling"]
    assert (s.top_k, s.min_p, s.repetition_penalty) == (40, 0.05, 1.1)
    assert (s.presence_penalty, s.frequency_penalty, s.min_tokens) == (0.5, 0.25, 2)
    assert s.ignore_eos is True and s.stop_token_ids == [2, 3] and s.top_logprobs == 3
    assert s.structured.json_schema == SCHEMA


@pytest.mark.parametrize(
    ("args", "check"),
    [
        (["--choice", "yes", "--choice", "no"], lambda st: st.choice == ["yes", "no"]),
        (["--regex", "[0-9]+"], lambda st: st.regex == "[0-9]+"),
        (["--json-object"], lambda st: st.json_object),
        (["--json-schema", json.dumps(SCHEMA)], lambda st: st.json_schema == SCHEMA),
        (["--grammar", 'root ::= "a" | "b"'], lambda st: st.grammar == 'root ::= "a" | "b"'),
    ],
)
def test_structured_output_options(fake, args, check) -> None:
    r = run("acme/extract", "x", *args)
    assert r.exit_code == 0, r.output
    kw = fake.calls[0][2]
    assert kw["alias"] == "prod" and check(kw["sampling"].structured)


def test_grammar_from_a_file_and_no_options_send_no_sampling(fake, tmp_path) -> None:
    g = tmp_path / "yn.ebnf"
    g.write_text('root ::= "yes" | "no"\n')
    assert run("acme/extract", "x", "--grammar", str(g)).exit_code == 0
    assert fake.calls[0][2]["sampling"].structured.grammar == 'root ::= "yes" | "no"\n'
    assert run("acme/extract@canary", "x").exit_code == 0
    assert fake.calls[1][2]["sampling"] is None and fake.calls[1][2]["alias"] == "canary"


def test_logprobs_table_and_stop_reason_go_to_stderr(fake) -> None:
    alt = TopLogprob(token_id=9, token="5", logprob=-1.5)
    fake.answer = answer(
        "4",
        logprobs=[-0.2],
        token_logprobs=[TokenLogprob(token_id=8, token="4", logprob=-0.2, top=[alt])],
        stop_reason="\n",
    )
    r = run("acme/math", "2+2=", "--top-logprobs", "1")
    assert r.exit_code == 0, r.output
    assert r.stdout == "4\n"
    assert "-0.200" in r.stderr and "'5' -1.50" in r.stderr and "stopped by '\\n'" in r.stderr
    r = run("acme/math", "2+2=", "--json")
    assert json.loads(r.stdout)["token_logprobs"][0]["top"][0]["token"] == "5"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--json-schema", "missing.json"], 2, "neither a JSON object nor a file"),
        (["--json-schema", "{nope"], 2, "--json-schema: not JSON"),
        (["--json-schema", "[1]"], 2, "neither a JSON object nor a file"),
        (["--grammar", "nofile.ebnf"], 2, "neither a file nor a grammar"),
        (["--regex", "a", "--choice", "b"], 1, "set exactly one of json_schema, json_object"),
        (["--top-k", "x"], 2, "'x' is not a valid integer"),
    ],
)
def test_bad_options_are_one_clear_line(fake, args, code, message) -> None:
    r = run("acme/extract", "x", *args)
    assert r.exit_code == code, r.output
    assert message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output and not fake.calls  # nothing was sent


def test_help_teaches_with_examples() -> None:
    text = CliRunner().invoke(main, ["infer", "--help"]).output
    for option in (
        "--top-k",
        "--min-p",
        "--repetition-penalty",
        "--presence-penalty",
        "--frequency-penalty",
        "--min-tokens",
        "--ignore-eos",
        "--stop-token-id",
        "--json-schema FILE|JSON",
        "--regex",
        "--choice",
        "--grammar FILE|EBNF",
        "--top-logprobs",
    ):
        assert option in text, option
    assert "--json-schema person.json" in text and "--choice yes --choice no" in text

"""`mint infer`: answer a prompt with tenant/policy@alias, with vLLM's sampling and
structured-output settings (the SDK's ``MintClient.infer`` keywords, mint.sdk.sampling)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mint.commands.args import tenant_policy
from mint.commands.clients import cli_client
from mint.commands.errors import one_line_errors

console = Console(stderr=True)


def read_json_schema(value: str | None) -> dict[str, Any] | None:
    """--json-schema: inline JSON (it starts with ``{``) or a file holding it."""
    if value is None:
        return None
    text, where = value, "--json-schema"
    if not value.lstrip().startswith("{"):
        neither = (
            "a JSON object nor a file; pass a schema such as "
            '\'{"type": "object", ...}\' or the path of a .json file holding one'
        )
        text, where = _file_text(value, "--json-schema", neither), f"--json-schema {value}"
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(
            f"{where}: not JSON ({e.msg}, line {e.lineno} column {e.colno})",
            param_hint="--json-schema",
        ) from None
    if not isinstance(schema, dict):
        raise click.BadParameter(
            f"{where}: a JSON schema is an object, got {type(schema).__name__}",
            param_hint="--json-schema",
        )
    return schema


def read_grammar(value: str | None) -> str | None:
    """--grammar: a file holding an EBNF grammar, or the grammar itself (it has a ``::=``)."""
    if value is None or "::=" in value:
        return value
    neither = (
        "a file nor a grammar (no '::=' rule); pass the path of an EBNF grammar file or the "
        'grammar itself, e.g. \'root ::= "yes" | "no"\''
    )
    return _file_text(value, "--grammar", neither)


def _file_text(value: str, flag: str, neither: str) -> str:
    """The text of the file ``value`` names; a usage error of ``flag`` when there is none."""
    path = Path(value)
    if not path.is_file():
        raise click.BadParameter(f"{value!r} is neither {neither}", param_hint=flag)
    return path.read_text()


def _print_logprobs(r: Any) -> None:
    """Each sampled token with its log-probability and alternatives, on stderr (stdout keeps
    only the answer, for pipes)."""
    rows = r.token_logprobs
    if rows:
        table = Table("token", "id", "logprob", "alternatives")
        for t in rows:
            alts = ", ".join(f"{a.token!r} {a.logprob:.2f}" for a in t.top)
            table.add_row(escape(repr(t.token)), str(t.token_id), f"{t.logprob:.3f}", escape(alts))
        console.print(table)
    elif r.logprobs:
        console.print(" ".join(f"{lp:.3f}" for lp in r.logprobs))


@click.command("infer")
@click.argument("reference")
@click.argument("prompt")
@click.option("--max-tokens", default=16, help="Most tokens in the answer.")
@click.option(
    "--chat",
    is_flag=True,
    help="Send PROMPT as a user turn of the model's chat template (instruct models).",
)
@click.option("--temperature", default=0.0, help="0: greedy.")
@click.option("--top-p", default=1.0, help="Nucleus sampling: probability mass kept.")
@click.option("--top-k", type=int, default=None, help="Sample among the k likeliest (-1: all).")
@click.option("--min-p", type=float, default=None, help="Drop tokens below min-p × the top one.")
@click.option("--seed", type=int, default=None, help="Same seed, same sample.")
@click.option("--repetition-penalty", type=float, default=None, help=">1 discourages repeats.")
@click.option("--presence-penalty", type=float, default=None, help="Penalty for any repeat.")
@click.option("--frequency-penalty", type=float, default=None, help="Penalty per repeat.")
@click.option("--min-tokens", type=int, default=None, help="No stop before this many tokens.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence.")
@click.option("--stop", multiple=True, help="Stop before this text (repeatable).")
@click.option(
    "--stop-token-id", type=int, multiple=True, help="Stop at this token id (repeatable)."
)
@click.option(
    "--json-schema",
    "json_schema",
    default=None,
    metavar="FILE|JSON",
    help="The answer is JSON valid against this schema (a .json file or inline JSON).",
)
@click.option("--json-object", is_flag=True, help="The answer is a JSON object (any).")
@click.option("--regex", default=None, help="The answer matches this regular expression.")
@click.option("--choice", multiple=True, help="The answer is one of these (repeatable).")
@click.option(
    "--grammar", default=None, metavar="FILE|EBNF", help="The answer follows this EBNF grammar."
)
@click.option("--logprobs", is_flag=True, help="Print each token's log-probability (stderr).")
@click.option(
    "--top-logprobs",
    type=int,
    default=None,
    help="Also each token's k likeliest alternatives (implies --logprobs).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the whole infer.completed payload as one JSON line instead of the text.",
)
@click.option("--timeout", default=120.0, help="Seconds to wait for the answer.")
@one_line_errors
def infer(
    reference: str,
    prompt: str,
    max_tokens: int,
    chat: bool,
    temperature: float,
    top_p: float,
    seed: int | None,
    stop: tuple[str, ...],
    stop_token_id: tuple[int, ...],
    ignore_eos: bool,
    json_schema: str | None,
    json_object: bool,
    choice: tuple[str, ...],
    grammar: str | None,
    logprobs: bool,
    as_json: bool,
    timeout: float,
    **sampling: Any,
) -> None:
    """Answer PROMPT with tenant/policy@alias or @N (needs a serving worker).

    \b
    The options are vLLM's sampling settings; --json-schema, --json-object, --regex,
    --choice and --grammar constrain the answer (one of them). The answer goes to stdout:
      mint infer demo/arith@prod "What is 4 + 5? Answer with just the number." --chat
      mint infer demo/arith@prod "Sample a sum" --temperature 0.8 --top-k 40 --min-p 0.05 \\
          --repetition-penalty 1.1 --seed 7 --stop-token-id 2
      mint infer demo/arith@prod "Alice is 31. As JSON:" --chat --max-tokens 64 \\
          --json-schema person.json
      mint infer demo/arith@prod "Alice is 31. Her age as JSON:" --chat --max-tokens 32 \\
          --json-schema '{"type": "object", "properties": {"age": {"type": "integer"}},
          "required": ["age"]}' | jq .age
      mint infer demo/arith@prod "Is 7 prime?" --choice yes --choice no
      mint infer demo/arith@prod "4 + 5 =" --regex '[0-9]+' --top-logprobs 3
    A value vLLM refuses (e.g. a schema it cannot compile) fails that request with vLLM's
    message (exit 1).
    """
    from mint.sdk.sampling import sampling_options

    tenant, policy = tenant_policy(reference)
    target = reference.partition("@")[2] or "prod"
    options = sampling_options(
        **sampling,
        stop_token_ids=list(stop_token_id) or None,
        ignore_eos=ignore_eos or None,
        json_schema=read_json_schema(json_schema),
        json_object=json_object,
        choice=list(choice) or None,
        grammar=read_grammar(grammar),
    )  # checked before anything is sent (InvalidSampling: one line, exit 1)
    where = {"revision": int(target)} if target.isdigit() else {"alias": target}
    with cli_client(tenant, timeout) as c:
        r = c.infer(
            policy,
            prompt,
            max_tokens=max_tokens,
            chat=chat,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            logprobs=logprobs,
            sampling=options,
            **where,
        )
    if as_json:
        click.echo(r.model_dump_json())
        return
    console.print(f"revision {r.revision} on {r.engine_id} ({r.latency_ms:.0f} ms):")
    click.echo(r.text)
    _print_logprobs(r)
    if r.stop_reason is not None:
        console.print(f"stopped by {r.stop_reason!r} ({r.finish_reason})", markup=False)


COMMANDS: list[click.Command] = [infer]

"""Sending a parity case to a server and comparing two servers' answers
(test_vllm_serve_parity.py): a 200 is reduced to what a client reads (texts, tool calls, finish
and stop reasons, token ids, usage, logprobs), streamed or not, and two answers differ where a
client would see it. Logprobs may differ by ``TOLERANCE``; ids differ only at a near-tie (a
candidate within ``TOLERANCE`` of the last one kept)."""

from __future__ import annotations

import inspect
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from .parity_cases import Case

TOLERANCE = 0.05


@dataclass
class Answer:
    status: int  # -1: an error event inside a stream
    view: dict[str, Any] | None = None  # a 200's answer as a client reads it
    error: str = ""
    code: Any = None
    seconds: float = 0.0


def ask(client: openai.OpenAI, root: str, key: str, model: str, case: Case) -> Answer:
    body = {"model": model, **case.body}
    t0 = time.perf_counter()
    if case.route in ("tokenize", "detokenize"):
        r = httpx.post(
            f"{root}/{case.route}",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=240,
        )
        data = r.json()
        if r.status_code != 200:
            return _failed(r.status_code, data, t0)
        return Answer(200, data, seconds=time.perf_counter() - t0)
    api = client.chat.completions if case.route == "chat" else client.completions
    known = set(inspect.signature(api.create).parameters)
    kw = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    try:
        if body.get("stream"):
            chunks = [c.model_dump() for c in api.create(**kw, extra_body=extra)]
            data = assemble(case.route, chunks)
            status = 200
        else:
            raw = api.with_raw_response.create(**kw, extra_body=extra)
            data, status = raw.http_response.json(), raw.http_response.status_code
    except openai.APIStatusError as e:
        return _failed(e.status_code, _json(e.response), t0)
    except openai.APIError as e:  # an error event after the stream began
        return Answer(-1, error=f"stream error: {e.message}", seconds=time.perf_counter() - t0)
    return Answer(status, view(case.route, data), seconds=time.perf_counter() - t0)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"error": {"message": response.text[:300]}}


def _failed(status: int, data: Any, t0: float) -> Answer:
    err = data.get("error", data) if isinstance(data, dict) else data
    message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    code = err.get("code") if isinstance(err, dict) else None
    return Answer(status, error=str(message), code=code, seconds=time.perf_counter() - t0)


def assemble(route: str, chunks: list[dict]) -> dict:
    """A stream's chunks as the body a non-streamed request would get."""
    choices: dict[int, dict] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices") or []:
            out = choices.setdefault(c["index"], {"index": c["index"], "text": "", "calls": {}})
            out["finish_reason"] = c.get("finish_reason") or out.get("finish_reason")
            out["stop_reason"] = c.get("stop_reason", out.get("stop_reason"))
            if route == "completions":
                out["text"] += c.get("text") or ""
                continue
            delta = c.get("delta") or {}
            out["text"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                mine = out["calls"].setdefault(call["index"], {"name": None, "arguments": ""})
                fn = call.get("function") or {}
                mine["name"] = mine["name"] or fn.get("name")
                mine["arguments"] += fn.get("arguments") or ""
    body_choices = []
    for i in sorted(choices):
        c = choices[i]
        base = {"index": i, "finish_reason": c["finish_reason"], "stop_reason": c["stop_reason"]}
        if route == "completions":
            body_choices.append({**base, "text": c["text"]})
            continue
        calls = [{"function": c["calls"][k]} for k in sorted(c["calls"])]
        message = {"content": c["text"] or None, "tool_calls": calls}
        body_choices.append({**base, "message": message})
    return {"choices": body_choices, "usage": usage}


def view(route: str, body: dict) -> dict:
    """What a client reads from a 200."""
    usage = body.get("usage") or {}
    out: dict[str, Any] = {
        "usage": (usage.get("prompt_tokens"), usage.get("completion_tokens")),
        "prompt_token_ids": body.get("prompt_token_ids"),
        "prompt_logprobs": body.get("prompt_logprobs"),
        "choices": [],
    }
    for c in sorted(body.get("choices") or [], key=lambda c: c["index"]):
        lp = c.get("logprobs") or {}
        choice = {
            "finish_reason": c.get("finish_reason"),
            "stop_reason": c.get("stop_reason"),
            "token_ids": c.get("token_ids"),
        }
        if route == "chat":
            msg = c.get("message") or {}
            content = lp.get("content") or []
            choice |= {
                "text": msg.get("content") or "",
                "calls": [
                    (t["function"]["name"], t["function"]["arguments"])
                    for t in msg.get("tool_calls") or []
                ],
                "tokens": [t["token"] for t in content],
                "logprobs": [t["logprob"] for t in content],
                "top": [{a["token"]: a["logprob"] for a in t["top_logprobs"]} for t in content],
            }
        else:
            choice |= {
                "text": c.get("text") or "",
                "calls": [],
                "tokens": lp.get("tokens") or [],
                "logprobs": lp.get("token_logprobs") or [],
                "top": lp.get("top_logprobs") or [],
            }
            out["prompt_logprobs"] = out["prompt_logprobs"] or c.get("prompt_logprobs")
            out["prompt_token_ids"] = out["prompt_token_ids"] or c.get("prompt_token_ids")
        out["choices"].append(choice)
    return out


def compare(case: Case, v: Answer, m: Answer) -> list[str]:
    """How MinT's answer differs from vllm serve's (empty: the same)."""
    if case.rule is not None:
        r = case.rule
        out = []
        if v.status != r.vllm_status:
            out.append(f"vllm serve answered {v.status}, not {r.vllm_status}")
        if m.status != r.mint_status or (r.mint_code and m.code != r.mint_code):
            out.append(f"MinT answered {m.status} {m.code}, not {r.mint_status} {r.mint_code}")
        return out
    if v.status != m.status:
        return [f"status {v.status} != {m.status}"]
    if v.status != 200 or not case.compare_text:
        return []
    if case.route in ("tokenize", "detokenize"):
        return [] if v.view == m.view else [f"{_short(v.view)} != {_short(m.view)}"]
    a, b = v.view, m.view
    out = _same(a, b, ("usage", "prompt_token_ids"))
    if len(a["choices"]) != len(b["choices"]):
        return [*out, f"{len(a['choices'])} choices != {len(b['choices'])}"]
    for i, (x, y) in enumerate(zip(a["choices"], b["choices"], strict=True)):
        keys = ("text", "calls", "finish_reason", "stop_reason", "token_ids", "tokens")
        out += [f"choice {i} {d}" for d in _same(x, y, keys)]
        out += [f"choice {i} {d}" for d in _close_list(x["logprobs"], y["logprobs"])]
        for j, (s, t) in enumerate(zip(x["top"], y["top"], strict=False)):
            out += [f"choice {i} top_logprobs[{j}] {d}" for d in _close_map(s, t)]
    out += _prompt_logprobs(a["prompt_logprobs"], b["prompt_logprobs"])
    return out


def _same(a: dict, b: dict, keys: tuple[str, ...]) -> list[str]:
    return [f"{k}: {_short(a[k])} != {_short(b[k])}" for k in keys if a[k] != b[k]]


def _close_list(a: list, b: list) -> list[str]:
    if len(a) != len(b):
        return [f"{len(a)} logprobs != {len(b)}"]
    bad = [
        i
        for i, (x, y) in enumerate(zip(a, b, strict=True))
        if (x is None) != (y is None) or (x is not None and abs(x - y) > TOLERANCE)
    ]
    return [f"logprob[{i}] {a[i]} != {b[i]}" for i in bad[:3]]


def _close_map(a: dict | None, b: dict | None) -> list[str]:
    """Two positions' alternatives (token → logprob): the same size, common ones within
    TOLERANCE, the others only at a near-tie with the other side's last one."""
    if a is None or b is None:
        return [] if a is b else [f"{_short(a)} != {_short(b)}"]
    if len(a) != len(b):
        return [f"{len(a)} alternatives != {len(b)}"]
    out = [f"{k}: {a[k]} != {b[k]}" for k in a.keys() & b.keys() if abs(a[k] - b[k]) > TOLERANCE]
    for x, y in ((a, b), (b, a)):
        floor = min(y.values(), default=-math.inf)
        out += [
            f"{k!r} {x[k]} only on one side"
            for k in x.keys() - y.keys()
            if x[k] > floor + TOLERANCE
        ]
    return out


def _prompt_logprobs(a: list | None, b: list | None) -> list[str]:
    """vLLM's ``prompt_logprobs`` (per position None or {id: {logprob, rank, decoded_token}}).
    MinT rule (README, prompt_logprobs): ``rank`` is null."""
    if a is None or b is None:
        return [] if a is b else ["prompt_logprobs on one side only"]
    if len(a) != len(b):
        return [f"{len(a)} prompt positions != {len(b)}"]
    out = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x is None or y is None:
            out += [] if x is y else [f"prompt_logprobs[{i}] {_short(x)} != {_short(y)}"]
            continue
        out += [f"prompt_logprobs[{i}] {d}" for d in _close_map(_lp(x), _lp(y))]
        for tid in x.keys() & y.keys():
            if x[tid]["decoded_token"] != y[tid]["decoded_token"]:
                out.append(f"prompt_logprobs[{i}][{tid}] decoded_token differs")
            if y[tid].get("rank") not in (None, x[tid].get("rank")):
                out.append(f"prompt_logprobs[{i}][{tid}] rank {y[tid]['rank']} (not null)")
    return out[:5]


def _lp(position: dict) -> dict:
    return {tid: entry["logprob"] for tid, entry in position.items()}


def _short(value: Any, chars: int = 90) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= chars else text[: chars - 1] + "…"


def table(cases: list[Case], vllm: dict[str, Answer], mint: dict[str, Answer], results) -> str:
    """One row per case: statuses, same text (yes, - for refusals, rule, known, NO), seconds
    and what differs;
    then the refusals' messages side by side."""
    rows = [("case", "vllm", "mint", "same", "vllm s", "mint s", "difference")]
    for c in cases:
        v, m, diffs = vllm[c.name], mint[c.name], results[c.name]
        same = (
            ("known" if c.known else "NO")
            if diffs
            else "rule"
            if c.rule
            else "yes"
            if v.status == 200 and c.compare_text
            else "-"
        )
        rows.append(
            (
                c.name,
                str(v.status),
                str(m.status),
                same,
                f"{v.seconds:.2f}",
                f"{m.seconds:.2f}",
                "; ".join(diffs)[:160],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(6)) + "  " + r[6] for r in rows]
    matched = sum(not results[c.name] for c in cases)
    known = sum(bool(results[c.name]) and c.known is not None for c in cases)
    lines.append(
        f"{matched} of {len(cases)} cases answered alike (MinT rules asserted as rules); "
        f"{known} known differences (xfail), {len(cases) - matched - known} new"
    )
    lines.append("refusals (vllm serve | MinT):")
    for c in cases:
        v, m = vllm[c.name], mint[c.name]
        if v.status != 200 or m.status != 200:
            lines.append(f"  {c.name}: {v.error[:110]!r} | {m.error[:110]!r}")
    return "\n".join(lines)

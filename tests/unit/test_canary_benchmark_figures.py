"""benchmarks/_canary_figures.py on made-up client records: the canary's share while it ran, the
wrong-revision answers after the decision, the decision-to-move times and the line's targets."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from benchmarks._canary_figures import (
    Answer,
    Seen,
    decided_revision,
    draw_score,
    run_figures,
    share_figures,
    split_callers,
    summary,
    wrong_after,
)
from schemas.events import CanaryEnded, CanarySide

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def answer(i: int, sent: float, revision: int | None, *, caller: str | None = None, **kw) -> Answer:
    return Answer(
        index=i,
        caller=caller or f"c{i}",
        sent=sent,
        answered=sent + 0.1,
        revision=revision,
        response_id=f"chatcmpl-{i}",
        score=0.5 if revision else None,
        feedback_status=200 if revision else None,
        **kw,
    )


def ended(outcome: str, *, decided_ms: float = 40.0) -> SimpleNamespace:
    deciding = T0 + timedelta(seconds=10)
    payload = CanaryEnded(
        alias="prod",
        canary_id=uuid.uuid4(),
        revision=2,
        incumbent_revision=1,
        outcome=outcome,  # type: ignore[arg-type]
        reason="figures",
        canary=CanarySide(revision=2, answers=30, scores=14, score_sum=14 * 0.85),
        incumbent=CanarySide(revision=1, answers=70, scores=70, score_sum=70 * 0.7),
        deciding_event_at=deciding,
    )
    return SimpleNamespace(
        payload=payload, occurred_at=deciding + timedelta(milliseconds=decided_ms)
    )


def test_score_draws_are_seeded_per_request_and_clipped() -> None:
    assert draw_score(0, "better", 7, 0.85, 0.1) == draw_score(0, "better", 7, 0.85, 0.1)
    assert draw_score(0, "better", 7, 0.85, 0.1) != draw_score(0, "better", 8, 0.85, 0.1)
    draws = [draw_score(1, "x", i, 0.95, 0.5) for i in range(200)]
    assert min(draws) >= 0.0 and max(draws) <= 1.0 and 1.0 in draws


def test_decided_revision() -> None:
    assert decided_revision("promoted", 2, 1) == 2
    assert decided_revision("rolled_back", 2, 1) == 1
    assert decided_revision(None, 2, 1) is None


def test_share_counts_answers_sent_after_start_and_answered_before_the_end() -> None:
    answers = [
        answer(0, 0.5, 1),  # sent before the canary started: not counted
        *[answer(i, 1.0 + i, 2 if i % 4 == 0 else 1) for i in range(1, 9)],  # 2 of 8 canary
        answer(20, 9.95, 2),  # answered after the client saw the end: not counted
        answer(21, 3.0, None, error="APIStatusError: 503"),  # failed: not an answer
    ]
    f = share_figures(answers, canary=2, share_asked=0.3, started_seen=1.0, ended_seen=10.0)
    assert f["answers_while_running"] == 8 and f["canary_answers_while_running"] == 2
    assert f["canary_share"] == 0.25 and f["share_error_points"] == 5.0


def test_split_callers_counts_callers_served_by_both_revisions() -> None:
    answers = [
        answer(0, 1, 1, caller="a"),
        answer(1, 2, 2, caller="a"),
        answer(2, 3, 2, caller="b"),
    ]
    assert split_callers(answers) == 1
    assert split_callers(answers[1:]) == 0


def test_wrong_revision_answers_are_those_sent_after_the_decision() -> None:
    answers = [answer(0, 4.0, 1), answer(1, 5.5, 2), answer(2, 6.0, 1), answer(3, 7.0, 2)]
    assert wrong_after(answers, decision_seen=5.0, decided=2) == (3, 1)
    assert wrong_after(answers, decision_seen=None, decided=2) == (0, 0)


@pytest.mark.parametrize(
    ("outcome", "expected", "prod_after", "moved", "correct"),
    [
        ("promoted", "promoted", 2, True, True),
        ("promoted", "promoted", 2, False, False),  # no alias.moved seen: not carried out
        ("promoted", "promoted", 1, True, False),  # the catalog's prod did not move
        ("rolled_back", "rolled_back", 1, False, True),
        ("rolled_back", "promoted", 1, False, False),  # the wrong decision
    ],
)
def test_run_figures_judge_the_decision(outcome, expected, prod_after, moved, correct) -> None:
    e = ended(outcome)
    move = (
        SimpleNamespace(occurred_at=e.occurred_at + timedelta(milliseconds=15)) if moved else None
    )
    decided = 2 if outcome == "promoted" else 1
    answers = [answer(i, 1.0 + i * 0.1, 2 if i % 3 == 0 else 1) for i in range(60)]
    answers += [answer(100 + i, 20.0 + i * 0.1, decided) for i in range(5)]
    seen = Seen(2, 1, 0.3, expected, 1.0, e, 10.0, move, 10.1 if moved else None, prod_after)
    f = run_figures(answers, seen)
    assert f["decision_correct"] is correct
    assert f["outcome"] == outcome and f["answers_after_decision"] == 5
    assert f["wrong_revision_answers"] == 0
    assert f["decision_to_ended_ms"] == 40.0
    if outcome == "promoted" and moved:
        assert f["decision_to_moved_ms"] == 55.0 and f["decision_to_move_ms"] == 55.0
    elif outcome == "rolled_back":
        assert f["decision_to_move_ms"] == 40.0
    assert f["controller_canary"]["mean_score"] == 0.85
    assert f["client_mean_scores"] == {"1": 0.5, "2": 0.5}


def test_run_without_a_decision_is_not_correct() -> None:
    seen = Seen(2, 1, 0.1, "promoted", 0.0)
    f = run_figures([answer(0, 1.0, 1), answer(1, 2.0, None, error="boom")], seen)
    assert f["decision_correct"] is False and f["outcome"] is None
    assert f["errors"] == 1 and f["error_samples"] == ["boom"]
    assert f["answers_after_decision"] == 0 and f["decision_to_move_ms"] is None


def fig(correct=True, wrong=0, after=40, move=50.0, share_err=1.0) -> dict:
    return {
        "decision_correct": correct,
        "wrong_revision_answers": wrong,
        "answers_after_decision": after,
        "decision_to_move_ms": move,
        "share_error_points": share_err,
        "canary_share": 0.1,
    }


def test_summary_targets_and_met() -> None:
    s = summary({"better": fig(move=80.0), "worse": fig(move=20.0, share_err=1.5)})
    assert s["targets"] == {
        "decisions_correct": True,
        "wrong_revision_answers": 0,
        "share_error_points": 2.0,
    }
    assert all(s["met"].values())
    assert s["decision_to_move_ms_p50"] == 50.0 and s["share_error_points"] == 1.5
    s = summary({"better": fig(wrong=2), "worse": fig(correct=False, share_err=7.0)})
    assert s["met"] == {
        "decisions_correct": False,
        "wrong_revision_answers": False,
        "share_error_points": False,
    }
    # no answer after a decision proves nothing about wrong revisions
    assert summary({"better": fig(after=0)})["met"]["wrong_revision_answers"] is False
    assert summary({})["met"]["decisions_correct"] is False


def test_summary_reads_as_a_report_line() -> None:
    from benchmarks import report

    rows = report.rows_of({"benchmark": "canary", **summary({"better": fig(), "worse": fig()})})
    assert {r.figure: r.met for r in rows} == {
        "decisions_correct": True,
        "wrong_revision_answers": True,
        "share_error_points": True,
    }


def test_traffic_reads_the_revision_header_and_posts_feedback() -> None:
    """benchmarks/_canary_traffic.Traffic against a fake gateway: the openai client's answer id
    and x-mint-revision, the caller as ``user``, a score for the revision that answered."""
    import json

    import httpx

    from benchmarks._canary_traffic import Traffic

    asked, scored = [], []

    def gateway(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer sk-test"
        body = json.loads(request.content)
        if request.url.path == "/v1/feedback":
            scored.append(body)
            return httpx.Response(202, json={"accepted": True})
        asked.append(body)
        n = len(asked)
        return httpx.Response(
            200,
            headers={"x-mint-revision": "2" if n % 2 else "1"},
            json={
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "length",
                    }
                ],
            },
        )

    t = Traffic(
        "http://gw",
        "sk-test",
        "canary-better@prod",
        label="better",
        means={1: 0.7, 2: 0.85},
        callers=50,
        max_tokens=4,
        transport=httpx.MockTransport(gateway),
    )
    try:
        a, b = t.ask(0), t.ask(1)
        warm = t.ask(-1, feedback=False)
    finally:
        t.close()
    assert (a.revision, a.response_id, a.ok) == (2, "chatcmpl-1", True)
    assert (b.revision, warm.revision) == (1, 2) and warm.score is None
    assert asked[0]["user"] == a.caller == t.caller(0) and asked[0]["max_tokens"] == 4
    assert scored == [
        {"model": "canary-better@prod", "id": "chatcmpl-1", "score": a.score},
        {"model": "canary-better@prod", "id": "chatcmpl-2", "score": b.score},
    ]
    assert a.scored and a.score == draw_score(0, "better", 0, 0.85, 0.1)
    assert b.score == draw_score(0, "better", 1, 0.7, 0.1)


def test_traffic_counts_a_failed_request_as_an_error() -> None:
    import httpx

    from benchmarks._canary_traffic import Traffic

    t = Traffic(
        "http://gw",
        "k",
        "p@prod",
        label="worse",
        means={1: 0.7, 2: 0.5},
        callers=5,
        max_tokens=4,
        transport=httpx.MockTransport(
            lambda r: httpx.Response(503, json={"error": {"message": "busy"}})
        ),
    )
    try:
        a = t.ask(0)
    finally:
        t.close()
    assert not a.ok and a.revision is None and a.score is None
    assert a.error is not None and "503" in a.error


def test_traffic_threads_send_until_stopped_each_index_once() -> None:
    import time

    import httpx

    from benchmarks._canary_traffic import Traffic

    def gateway(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/feedback":
            return httpx.Response(200, json={})
        return httpx.Response(
            200,
            headers={"x-mint-revision": "1"},
            json={
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [],
            },
        )

    t = Traffic(
        "http://gw",
        "k",
        "p@prod",
        label="x",
        means={1: 0.7},
        callers=5,
        max_tokens=4,
        transport=httpx.MockTransport(gateway),
    )
    t.start(3)
    time.sleep(0.3)
    t.stop()
    n = len(t.snapshot())
    time.sleep(0.1)
    t.close()
    assert n > 3 and len(t.snapshot()) == n  # nothing sent after stop() returned
    assert sorted(a.index for a in t.snapshot()) == list(range(n))
    assert t.sent_since(0.0) == n and all(a.scored for a in t.snapshot())

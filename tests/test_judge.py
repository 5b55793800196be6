"""`marlhf judge` end to end against a scripted OpenAI-compatible server on loopback (the real
`openai` client), plus the answer parser and the statistics.

The fixture judge prefers the response that carries a marker word, wherever it is shown, so
a correct A/B mapping must give the marker's side every pair, in either order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from judge_server import JudgeServer, Reply
from marlhf_cli.cli import app
from marlhf_cli.evaluate import stats
from marlhf_cli.evaluate.judge_parse import parse

KEY = "sk-marlhf-TEST-secret-9f8e7d6c5b4a"
MARKER, PLAIN = "ZEBRA", "PLAIN"
PAIRS = 6


# ---------------------------------------------------------------------------------------
# fixtures


def _prompt(i: int) -> str:
    return f"SUBREDDIT: r/test\nTITLE: question {i}\nPOST: my post number {i} is about a problem I have.\nTL;DR:"


@pytest.fixture
def files(tmp_path):
    """a.jsonl carries the marker; b.jsonl the plain (and longer) responses."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"prompt": _prompt(i), "response": f"{MARKER} short {i}"}) + "\n" for i in range(PAIRS)))
    b.write_text("".join(json.dumps({"prompt": _prompt(i), "response": f"a {PLAIN} and longer summary {i} of it"}) + "\n" for i in range(PAIRS)))
    return a, b


def marker_slot(user: str) -> str:
    """The letter of the slot holding the marker response in the judge's message."""
    return "A" if user.find(MARKER) < user.find(PLAIN) else "B"


FORMATS = {
    "letter": (lambda c: c, "letter"),
    "answer-line": (lambda c: f"Summary {c} is more concise and precise.\nAnswer: {c}", "labelled"),
    "double-bracket": (lambda c: f"Both are short; verdict [[{c}]] after weighing it.", "labelled"),
    "json": (lambda c: json.dumps({"choice": c, "reason": "keeps the key points"}), "json"),
    "fenced-json": (lambda c: "Here you go:\n```json\n" + json.dumps({"choice": c}) + "\n```", "json"),
    "fenced-letter": (lambda c: f"My choice:\n```\n{c}\n```\nIt is shorter.", "fenced"),
    "last-line": (lambda c: f"The first covers less of the post than the other.\n\n**{c}**", "line"),
    "criteria-majority": (lambda c: json.dumps({"factual_accuracy": c, "coherence": "E", "helpfulness": c}), "json-criteria-majority"),
    "criteria-overall": (
        lambda c: json.dumps({"factual_accuracy": "B" if c == "A" else "A", "coherence": "E", "helpfulness": c, "overall": c}),
        "json-criteria",
    ),
}


def prefer_marker(fmt=lambda c: c):
    return lambda req: fmt(marker_slot(req.user))


def invoke(server, run_dir, a, b, *args, key=KEY):
    argv = ["judge", str(a), str(b), "--model", "judge-test", "--base-url", server.url, "--run-dir", str(run_dir),
            "--retry-wait", "0.01", "--timeout", "10", *args]  # fmt: skip
    return CliRunner().invoke(app, argv, env={"OPENAI_API_KEY": key, "COLUMNS": "200"})


def result_file(run_dir, name="a-vs-b"):
    return json.loads((Path(run_dir) / "judge" / f"{name}.json").read_text())


def assert_key_nowhere(root: Path, *outputs: str) -> None:
    for text in outputs:
        assert KEY not in text
    for path in Path(root).rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), f"the API key leaked into {path}"


# ---------------------------------------------------------------------------------------
# the parser and the statistics


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("choice", ["A", "B"])
def test_parser_reads_every_format(name, choice):
    fmt, how = FORMATS[name]
    parsed = parse(fmt(choice))
    assert (parsed.choice, parsed.how) == (choice, how)


@pytest.mark.parametrize(
    "reply, choice",
    [("E", "E"), ("Tie", "E"), ("Answer: E", "E"), ('{"choice": "tie"}', "E"), ("Response B", "B"),
     ('{"factual_accuracy": "A", "coherence": "B", "helpfulness": "E"}', "E"), ("  **B**.", "B")],
)  # fmt: skip
def test_parser_ties_and_decorations(reply, choice):
    assert parse(reply).choice == choice


@pytest.mark.parametrize(
    "reply, reason",
    [("", "empty"), (None, "empty"), ("Both have merits; hard to say.", "no answer"), ("Answer: A\nActually, Answer: B", "conflicting"),
     ('{"choice": "C"}', "not A, B or E"), ("answer: a good summary is hard to write", "no answer"),
     ('{"choice": "A"} and {"choice": "B"}', "conflicting")],
)  # fmt: skip
def test_parser_never_guesses(reply, reason):
    parsed = parse(reply)
    assert parsed.choice is None and parsed.how.startswith("unparsed") and reason in parsed.how


def test_wilson_interval_and_sign_test():
    assert stats.wilson(0, 0) is None
    low, high = stats.wilson(0, 50)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.07135, abs=1e-4)
    low, high = stats.wilson(25, 50)
    assert low == pytest.approx(1 - high) and 0.36 < low < 0.37
    assert stats.sign_test(10, 0) == pytest.approx(2 * 0.5**10)


def test_length_controlled_win_rate_discounts_length():
    """A wins exactly when it is longer: the raw rate is 75%, but at zero length difference
    the regression must put A near a coin flip; with no length signal it stays the raw rate."""
    diffs = [30, 25, 20, 15, 10, 5, -5, -10] * 5
    verdicts = ["win" if d > 0 else "loss" for d in diffs]
    verdicts[-1] = verdicts[-9] = "win"
    lc = stats.length_controlled(verdicts, diffs)
    raw = sum(v == "win" for v in verdicts) / len(verdicts)
    assert raw > 0.75 and abs(lc["win_rate"] - 0.5) < abs(raw - 0.5) and lc["length_coef"] > 0
    flat = stats.length_controlled(["win"] * 30 + ["loss"] * 10, [0.0] * 40)
    assert flat["win_rate"] == pytest.approx(0.75, abs=0.02)
    assert stats.length_controlled(["win"] * 20, [3.0, -2.0] * 10)["win_rate"] > 0.9  # finite when one side always wins
    assert stats.length_controlled(["win", "loss"] * 5, [4.0] * 10) is None  # length and quality inseparable


def test_agreement_table():
    first = {"p1": "win", "p2": "win", "p3": "tie", "p4": "loss", "p5": "unparsed"}
    second = {"p1": "win", "p2": "loss", "p3": "tie", "p4": "loss", "p5": "win", "p6": "win"}
    out = stats.agreement(first, second)
    assert out["pairs"] == 4 and out["table"]["win"]["loss"] == 1 and out["rate"] == 0.75
    assert out["pairs_without_ties"] == 3 and out["rate_without_ties"] == pytest.approx(2 / 3)


# ---------------------------------------------------------------------------------------
# end to end against the server


@pytest.mark.parametrize("name", FORMATS)
def test_marker_side_wins_every_pair_in_every_format(tmp_path, files, name):
    fmt, how = FORMATS[name]
    run = tmp_path / "run"
    with JudgeServer(prefer_marker(fmt)) as server:
        result = invoke(server, run, *files)
    assert result.exit_code == 0, result.output
    data = result_file(run)
    assert data["stats"]["win"] == PAIRS and data["stats"]["win_rate"] == 1.0
    assert {o["how"] for p in data["pairs"] for o in p["orders"]} == {how}
    # the order really was randomised: file A's response was shown first and second
    assert {o["first"] for p in data["pairs"] for o in p["orders"]} == {"a", "b"}
    if name.startswith("criteria"):
        assert data["stats"]["criteria"]["helpfulness"]["win"] == PAIRS
    assert len(server.answered()) == PAIRS and {r["model"] for r in server.log} == {"judge-test"}
    assert all(r["authorization"] == f"Bearer {KEY}" for r in server.log)
    assert_key_nowhere(tmp_path, result.output)


@pytest.mark.parametrize("both", [False, True], ids=["one-order", "both-orders"])
@pytest.mark.parametrize("marker_in", ["a", "b"])
def test_swapping_keeps_the_mapping(tmp_path, files, both, marker_in):
    a, b = files if marker_in == "a" else files[::-1]
    run = tmp_path / "run"
    with JudgeServer(prefer_marker(FORMATS["answer-line"][0])) as server:
        result = invoke(server, run, a, b, "--name", "cmp", *(["--both-orders"] if both else []))
    assert result.exit_code == 0, result.output
    s = result_file(run, "cmp")["stats"]
    expected = "win" if marker_in == "a" else "loss"
    assert s[expected] == PAIRS and s[f"{expected}_rate"] == 1.0
    assert len(server.answered()) == PAIRS * (2 if both else 1)
    if both:
        assert s["position_bias"]["inconsistent"] == 0 and s["position_bias"]["pairs"] == PAIRS
    assert (run / "plots" / "judge.png").stat().st_size > 1000


def test_position_bias_is_measured(tmp_path, files):
    """A judge that always picks the first slot: both orders turn every pair into a tie."""
    run = tmp_path / "run"
    with JudgeServer(lambda req: "A") as server:
        result = invoke(server, run, *files, "--both-orders")
    assert result.exit_code == 0, result.output
    s = result_file(run)["stats"]
    assert s["tie"] == PAIRS and s["position_bias"]["inconsistent_rate"] == 1.0
    assert s["position_bias"]["same_slot_rate"] == 1.0 and s["position_bias"]["first_slot_choice_rate"] == 1.0
    assert "position bias" in result.output


def test_unparseable_replies_are_kept_and_counted(tmp_path, files):
    def responder(req):
        return "Both summaries have merits." if "question 1\n" in req.user or "question 4\n" in req.user else marker_slot(req.user)

    run = tmp_path / "run"
    with JudgeServer(responder) as server:
        result = invoke(server, run, *files)
    assert result.exit_code == 0, result.output
    data = result_file(run)
    assert data["stats"]["unparsed"] == 2 and data["stats"]["decided"] == PAIRS - 2 and data["stats"]["win_rate"] == 1.0
    unparsed = [o for p in data["pairs"] for o in p["orders"] if o["verdict"] == "unparsed"]
    assert len(unparsed) == 2 and all(o["reply"] == "Both summaries have merits." for o in unparsed)
    assert "could not be parsed" in result.output
    # a rerun reads the cached replies: nothing is asked again
    with JudgeServer(prefer_marker()) as again:
        assert invoke(again, run, *files).exit_code == 0
    assert again.log == []


def test_rate_limits_and_server_errors_are_retried(tmp_path, files):
    def responder(req):
        if req.attempt == 0:
            return Reply(status=429, message="slow down", headers={"Retry-After": "0"})
        if req.attempt == 1:
            return Reply(status=500, message="boom")
        return marker_slot(req.user)

    run = tmp_path / "run"
    with JudgeServer(responder) as server:
        result = invoke(server, run, *files, "--concurrency", "3")
    assert result.exit_code == 0, result.output
    data = result_file(run)
    assert data["stats"]["win"] == PAIRS
    assert Counter(r["status"] for r in server.log) == {429: PAIRS, 500: PAIRS, 200: PAIRS}
    assert all(o["attempts"] == 3 for p in data["pairs"] for o in p["orders"])
    assert data["judge"]["asked"] == PAIRS and data["judge"]["http_requests"] == 3 * PAIRS


def test_slow_replies_time_out_and_are_retried(tmp_path, files):
    def responder(req):
        return Reply(content="A", delay=2.0) if req.attempt == 0 else marker_slot(req.user)

    run = tmp_path / "run"
    with JudgeServer(responder) as server:
        result = invoke(server, run, *files, "--timeout", "0.5", "--concurrency", str(PAIRS))
    assert result.exit_code == 0, result.output
    data = result_file(run)
    assert data["stats"]["win"] == PAIRS, "a late reply must not be used"
    assert all(o["attempts"] == 2 for p in data["pairs"] for o in p["orders"])  # the timeout fired, then the retry


def test_failures_are_summarised_and_a_rerun_asks_only_for_them(tmp_path, files):
    def responder(req):
        if "question 2\n" in req.user:
            return Reply(status=503, message="overloaded")
        return marker_slot(req.user)

    run = tmp_path / "run"
    with JudgeServer(responder) as server:
        result = invoke(server, run, *files, "--max-retries", "2")
    assert result.exit_code == 1
    assert "1 judgement got no reply" in result.output and "InternalServerError 503" in result.output
    data = result_file(run)
    assert data["stats"]["failed"] == 1 and data["stats"]["win"] == PAIRS - 1
    assert Counter(r["status"] for r in server.log)[503] == 3  # first try + 2 retries
    with JudgeServer(prefer_marker()) as healthy:
        again = invoke(healthy, run, *files)
    assert again.exit_code == 0, again.output
    assert len(healthy.log) == 1 and "question 2\n" in healthy.log[0]["user"]
    assert result_file(run)["stats"]["win"] == PAIRS
    assert_key_nowhere(tmp_path, result.output, again.output)


def test_a_refused_key_stops_with_one_line_and_never_leaks(tmp_path, files):
    """The server echoes the key in its 401 message; marlhf must print and write neither."""
    with JudgeServer(lambda req: Reply(status=401, message=f"Incorrect API key provided: {KEY}")) as server:
        result = invoke(server, tmp_path / "run", *files, "--debug")
    assert result.exit_code == 2
    assert "refused" in result.output and "AuthenticationError 401" in result.output
    assert len(server.log) <= 4  # the others stop instead of trying too
    assert_key_nowhere(tmp_path, result.output)


def _closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_refused_connection_fails_at_once_in_one_line(tmp_path, files, monkeypatch):
    """A wrong --base-url retried 'connection refused' for 76 s, then wrote judge/a-vs-b.json
    and an empty bar into plots/judge.png."""
    from marlhf_cli.evaluate import client

    def no_retry(self, state):
        raise AssertionError("a refused connection was retried")

    monkeypatch.setattr(client._Backoff, "__call__", no_retry)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    run = tmp_path / "run"
    argv = ["judge", *map(str, files), "--model", "judge-test", "--base-url", url, "--run-dir", str(run), "--max-retries", "6"]
    result = CliRunner().invoke(app, argv, env={"OPENAI_API_KEY": KEY, "COLUMNS": "80"})
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: cannot connect to the judge at {url}") and "--base-url" in line, line
    assert not list(run.glob("judge/*.json")) and not (run / "plots").exists()
    assert "judge/a-vs-b" not in json.loads((run / "run.json").read_text()).get("stages", {}) if (run / "run.json").exists() else True


def test_a_comparison_with_no_judged_pair_records_nothing(tmp_path, files):
    from marlhf_cli.artifacts import RunDir
    from marlhf_cli.evaluate.judge import _bars

    a, b = files
    c = tmp_path / "c.jsonl"
    c.write_text(b.read_text().replace(PLAIN, "OTHER"))
    run = tmp_path / "run"
    with JudgeServer(prefer_marker()) as healthy:
        assert invoke(healthy, run, a, b).exit_code == 0
    with JudgeServer(lambda req: Reply(status=503, message="overloaded")) as failing:
        result = invoke(failing, run, a, c, "--max-retries", "1")
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"no pair of a-vs-c was judged: {PAIRS} judgements got no reply ({PAIRS} x InternalServerError 503" in said
    assert "nothing written" in said
    assert not (run / "judge" / "a-vs-c.json").exists() and not (run / "plots" / "judge-a-vs-c.png").exists()
    assert [bar["label"] for bar in _bars(RunDir(run))] == ["a-vs-b (judge-test)"]  # plots/judge.png's bars
    assert set(json.loads((run / "run.json").read_text())["stages"]) == {"judge/a-vs-b"}


def test_sample_and_cache_reuse(tmp_path, files):
    run = tmp_path / "run"
    with JudgeServer(prefer_marker()) as server:
        first = invoke(server, run, *files, "--sample", "3")
        assert first.exit_code == 0, first.output
        assert result_file(run)["stats"]["pairs"] == 3 and len(server.log) == 3
        full = invoke(server, run, *files)
    assert full.exit_code == 0, full.output
    assert len(server.log) == PAIRS, "the three sampled pairs came from the cache"


def test_template_and_option_errors(tmp_path, files):
    bad = tmp_path / "bad.txt"
    bad.write_text("Compare {{response_a}} with {{response_b}}.")
    good = tmp_path / "good.txt"
    good.write_text('Task: {{prompt}}\nFirst: {{response_a}}\nSecond: {{response_b}}\nReply {"choice": "A"|"B"|"E"}.')
    with JudgeServer(prefer_marker()) as server:
        missing = invoke(server, tmp_path / "run", *files, "--template", str(bad))
        custom = invoke(server, tmp_path / "run", *files, "--template", str(good))
    assert missing.exit_code == 2 and "lacks {{prompt}}" in missing.output
    assert custom.exit_code == 0, custom.output
    assert server.log and all(r["authorization"] for r in server.log)
    no_judge = CliRunner().invoke(app, ["judge", *map(str, files), "--run-dir", str(tmp_path / "x")])
    assert no_judge.exit_code == 2 and "choose a judge" in no_judge.output
    no_key = CliRunner().invoke(app, ["judge", *map(str, files), "--gpt4", "--run-dir", str(tmp_path / "x")], env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    assert no_key.exit_code == 2 and "OPENAI_API_KEY" in no_key.output


def test_unmatched_and_bad_rows_are_reported(tmp_path, files):
    a, b = files
    with a.open("a") as handle:
        handle.write(json.dumps({"prompt": _prompt(99), "response": "only in a"}) + "\n")
        handle.write(json.dumps({"prompt": _prompt(0), "response": "repeated"}) + "\n")
        handle.write(json.dumps({"prompt": _prompt(98)}) + "\n")
    with JudgeServer(prefer_marker()) as server:
        result = invoke(server, tmp_path / "run", a, b)
    assert result.exit_code == 0, result.output
    notes = result_file(tmp_path / "run")["notes"]
    assert any("1 repeated prompt" in n for n in notes) and any("not in the other file" in n for n in notes)
    assert any("a.jsonl:9: field 'response'" in n for n in notes)


def test_rows_without_a_field_are_named_not_reported_as_no_shared_prompt(tmp_path, files):
    """Every row of B names its text 'output': the error names file, line and field."""
    a, b = files
    rows = [json.loads(line) for line in b.read_text().splitlines()]
    b.write_text("".join(json.dumps({"prompt": r["prompt"], "output": r["response"]}) + "\n" for r in rows))
    with JudgeServer(prefer_marker()) as server:
        result = invoke(server, tmp_path / "run", a, b)
    assert result.exit_code == 2 and not server.log
    message = result.output.strip()
    assert "share no prompt" not in message and "\n" not in message
    assert f"{b}:1: field 'response'" in message and f"kept 0 of {PAIRS} rows" in message


def test_strict_stops_at_the_first_bad_row(tmp_path, files):
    """README: '--strict makes any bad row an error', for judge's sample files too."""
    a, b = files
    with a.open("a") as handle:
        handle.write(json.dumps({"prompt": _prompt(98)}) + "\n")
    with JudgeServer(prefer_marker()) as server:
        lenient = invoke(server, tmp_path / "run", a, b)
        strict = invoke(server, tmp_path / "run2", a, b, "--strict")
    assert lenient.exit_code == 0, lenient.output
    assert strict.exit_code == 2
    assert f"{a}:{PAIRS + 1}: field 'response'" in strict.output and "strict mode" in strict.output


def test_each_comparison_keeps_its_own_plot(tmp_path, files):
    """A second comparison in the same run directory must not replace the first one's plot."""
    a, b = files
    c = tmp_path / "c.jsonl"
    c.write_text(b.read_text().replace(PLAIN, "OTHER"))
    run = tmp_path / "run"
    with JudgeServer(lambda req: "A") as server:
        first = invoke(server, run, a, b)
        second = invoke(server, run, a, c)
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    plots = run / "plots"
    assert {p.name for p in plots.iterdir()} == {"judge-a-vs-b.png", "judge-a-vs-c.png", "judge.png"}
    assert "judge-a-vs-c.png" in second.output.replace("\n", "")


def test_identical_responses_are_a_tie_without_a_request(tmp_path, files):
    a, b = files
    rows = [json.loads(line) for line in b.read_text().splitlines()]
    rows[3]["response"] = json.loads(a.read_text().splitlines()[3])["response"]
    b.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with JudgeServer(prefer_marker()) as server:
        result = invoke(server, tmp_path / "run", a, b, "--both-orders")
    assert result.exit_code == 0, result.output
    s = result_file(tmp_path / "run")["stats"]
    assert (s["win"], s["tie"]) == (PAIRS - 1, 1) and len(server.log) == 2 * (PAIRS - 1)


# ---------------------------------------------------------------------------------------
# a kill mid-run: nothing answered is ever paid for twice


def test_kill_mid_run_never_pays_twice(tmp_path, files):
    run = tmp_path / "run"
    cache = run / "judge" / "cache"
    answered_before_kill = 5
    lock, granted = threading.Lock(), [0]
    mode = {"hold": True}

    def responder(req):
        with lock:
            if mode["hold"] and granted[0] >= answered_before_kill:
                return Reply(hold=True)
            granted[0] += 1
        return marker_slot(req.user)

    with JudgeServer(responder) as server:
        env = {**os.environ, "OPENAI_API_KEY": KEY}
        argv = [sys.executable, "-m", "marlhf_cli.cli", "judge", *map(str, files), "--model", "judge-test", "--base-url",
                server.url, "--run-dir", str(run), "--both-orders", "--concurrency", "2", "--retry-wait", "0.01"]  # fmt: skip
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (len(list(cache.glob("*.json"))) >= answered_before_kill and server.held()):
            assert child.poll() is None, child.stdout.read().decode()
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        output = child.communicate(timeout=30)[0].decode()
        assert child.returncode == -signal.SIGKILL
        assert len(list(cache.glob("*.json"))) == answered_before_kill
        first_run = {r["key"] for r in server.answered()}
        server.release()
        mode["hold"] = False
        result = invoke(server, run, *files, "--both-orders", "--concurrency", "2")
        assert result.exit_code == 0, result.output
        answered = Counter(r["key"] for r in server.answered())
    assert len(answered) == 2 * PAIRS and set(answered.values()) == {1}, "a judgement was paid for twice"
    second_run = [r["key"] for r in server.log if r["answered"] and r["key"] not in first_run]
    assert len(second_run) == 2 * PAIRS - answered_before_kill
    assert result_file(run)["stats"]["win"] == PAIRS
    assert_key_nowhere(tmp_path, output, result.output)


# ---------------------------------------------------------------------------------------
# the reward model as a judge, and its agreement with the LLM


def test_reward_model_judge_and_agreement(tmp_path, files):
    pytest.importorskip("gguf")
    run = tmp_path / "run"
    with JudgeServer(prefer_marker()) as server:
        assert invoke(server, run, *files).exit_code == 0
    result = CliRunner().invoke(app, ["judge", *map(str, files), "--rm", "--reward-model", "tiny", "--run-dir", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    data = result_file(run, "a-vs-b-rm")
    assert data["judge"]["kind"] == "rm" and data["stats"]["decided"] == PAIRS
    assert all(isinstance(p["score_a"], float) for p in data["pairs"])
    agreement = data["agreement"]
    assert agreement["pairs"] == PAIRS and sum(sum(row.values()) for row in agreement["table"].values()) == PAIRS
    assert agreement["table"]["win"]["win"] + agreement["table"]["win"]["loss"] + agreement["table"]["win"]["tie"] == PAIRS
    assert "agreement" in result.output
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["stages"]["judge/a-vs-b"]["metrics"]["rm"]["pairs"] == PAIRS

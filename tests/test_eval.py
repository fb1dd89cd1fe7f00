"""`clawloop eval` (simulated users with personas, a rater, checkpoint tasks) and `clawloop demo --url`
posting its curve: real servers on loopback, the official openai client, the real sandbox."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import httpx
import pytest

from clawloop.eval import _jsonl, await_update, check_code, extract_code
from clawloop.eval import main as eval_main
from clawloop.users import PERSONAS, WRONG, RuleRater, RuleUser, Server, parse_score, personas_from
from tests.conftest import require_or_skip, run_cli


def test_parse_score_reads_score_lines_and_rejects_what_is_not_a_0_to_10_score():
    assert parse_score("Score: 7") == 0.7
    assert parse_score("I would say score = 10.") == 1.0
    assert parse_score("The answer is fine, 3 out of 10... final 8") == 0.8
    assert parse_score("Score: 19") is None
    assert parse_score("no idea") is None
    assert parse_score("") is None


def test_rule_rater_and_user_follow_the_persona():
    rater, student, teacher = RuleRater(), PERSONAS["student"], PERSONAS["teacher"]
    q = {"question": "What is 12+7?", "answer": "19"}
    assert rater.score(student, q, "19") == 1.0
    assert rater.score(student, q, "The answer is 19!") == 0.5       # right, but AI-looking
    assert rater.score(teacher, q, "The answer is 19!") == 1.0
    assert rater.score(teacher, q, "20") == 0.0
    user = RuleUser(student.style)
    rng = random.Random(0)
    text, ok = user.reply(q, [{"role": "assistant", "content": "19"}], rng)
    assert ok
    text, ok = user.reply(q, [{"role": "assistant", "content": "The answer is 19."}], rng)
    assert not ok and text
    picky = RuleUser(student.style, check_answer=True)   # eval's users also want the right result
    text, ok = picky.reply(q, [{"role": "assistant", "content": "20"}], rng)
    assert not ok and text.split(".")[0] in {w.split(".")[0] for w in WRONG}
    from clawloop.judge.offline import classify_user_reply

    assert classify_user_reply(text).score == -1       # the offline judge reads it as a correction
    text, ok = picky.reply(q, [{"role": "assistant", "content": "19"}], rng)
    assert ok
    with pytest.raises(ValueError, match="--personas: unknown persona 'pirate'"):
        personas_from("student,pirate")


@pytest.mark.slow
def test_the_problems_are_distinct_and_the_change_of_correct_has_a_paired_standard_error():
    from clawloop.eval import change_se, problems

    probs = problems("tiny", 32, 0)  # drawn independently, 32 held 28 distinct questions (one sum 3 times)
    assert len({p["question"] for p in probs}) == 32
    assert [p["skill"] for p in probs[:4]] == ["add", "add", "sub", "fact"]
    two = probs[:2]
    right = [{"question": p["question"], "answer": p["answer"]} for p in two]
    wrong = [{"question": p["question"], "answer": "no idea"} for p in two]
    assert change_se(right * 2, right * 2, two) == 0.0  # no problem moved
    # one problem lost (1 -> 0), the other kept: mean change -0.5, differences' sd 0.707 over sqrt(2)
    assert change_se(right, [wrong[0], right[1]], two) == pytest.approx(0.5)
    assert change_se(right[:1], wrong[:1], two) is None  # one problem: no spread to read


def test_coding_check_runs_the_asserts_in_the_sandbox(tmp_path):
    from clawloop.envs.sandbox import SandboxUnavailable, choose_level

    try:
        choose_level("auto")
    except SandboxUnavailable as e:
        require_or_skip("sandbox", f"no sandbox level works here: {e}")
    rows = _jsonl("data/eval_coding.jsonl")
    assert len(rows) == 20 and len({r["task_id"] for r in rows}) == 20
    work = tmp_path
    for i, row in enumerate(rows):  # every reference solution passes its own asserts
        res = check_code(row, row["prompt"] + row["reference"], work / row["task_id"], slot=i)
        assert res["passed"], (row["task_id"], res)
    row = rows[0]
    wrong = check_code(row, row["prompt"] + "    return 0\n", work / "wrong")
    assert not wrong["passed"] and "AssertionError" in wrong["output"]
    early_exit = check_code(row, "import sys\nsys.exit(0)\n", work / "exit")
    assert not early_exit["passed"]
    loop = check_code(row, "while True:\n    pass\n", work / "loop")
    assert not loop["passed"]
    # the answer's fenced block is taken; a bare body is completed under the signature
    assert extract_code("Here:\n```python\ndef add_two(a, b):\n    return a + b\n```", "add_two",
                        row["prompt"]).startswith("def add_two")
    assert extract_code("    return a + b\n", "add_two", row["prompt"]).startswith(row["prompt"])


@pytest.mark.slow
def test_personas_before_and_after_training_with_built_in_users(tmp_path):
    """`clawloop eval` starts a clawloop up per persona (the tiny model), measures, lets the persona's users
    train it for an update, measures again at a newer policy version; JSON + PNG."""
    out = tmp_path / "eval.json"
    r = run_cli("eval", "--personas", "student,teacher", "--problems", "8", "--samples-per-problem", "1",
                "--train-updates", "1", "--batch-size", "8", "--wide-sums", "16", "--out", str(out), "--data-dir",
                str(tmp_path / "runs"), timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["mode"] == "personas" and set(res["personas"]) == {"student", "teacher"}
    for name, p in res["personas"].items():
        assert 0.0 <= p["before"] <= 1.0 and p["rated"] == p["asked"] == 8
        # `correct` per kind of question: the 8 problems are 6 sums and 2 facts, weighted so in the whole
        assert p["correct_before"] == pytest.approx((6 * p["correct_sums_before"] + 2 * p["correct_facts_before"]) / 8)
        assert p["updates"] >= 1 and p["after"] is not None
        # 16 other held-out sums x 2 beside the fixed problems, before and at the end (a version past the start)
        assert p["wide_sums"] == 16 and 0.0 <= p["correct_wide_before"] <= 1.0 and 0.0 <= p["correct_wide_after"] <= 1.0
        assert p["correct_wide_version"] >= p["curve"][-1]["policy_version"]
        assert f"correct_wide={p['correct_wide_before']:.2f}->{p['correct_wide_after']:.2f}" in r.stdout
        assert p["curve"][-1]["policy_version"] > p["policy_version_before"]
        # 8 distinct problems, and the change of `correct` with its standard error paired over them
        assert len({a["question"] for a in p["answers_before"]}) == 8
        assert p["correct_change_se"] is not None and 0.0 <= p["correct_change_se"] <= 0.5
        assert f"correct_change_se={p['correct_change_se']:.3f}" in r.stdout
        assert p["users"]["answers"] > 0
        # the users' conversations went through that persona's own clawloop and were captured there
        assert (tmp_path / "runs" / name / "up.log").exists()
        assert f"persona={name} before=" in r.stdout
    assert out.with_suffix(".png").stat().st_size > 1000


def test_a_round_does_not_idle_while_the_trainer_waits_for_samples(random_model_dir, tmp_path):
    """/health says whether the trainer is stepping or still waiting for a batch, and `clawloop eval` waits
    for a new version after a round only while a step can come: binary trains on accepted answers alone,
    so most of its rounds end with less than a batch waiting, and each used to idle `--settle-s`."""
    server = Server(["--model-path", str(random_model_dir), "--method", "binary", "--rollout-batch-size", "4",
                     "--judge", "offline", "--no-serve-status"], str(tmp_path / "up"))
    try:
        health = httpx.get(server.url + "/health").json()
        assert health["train"] == {"busy": False, "step": 0, "pending_samples": 0, "batch_size": 4}
        t0 = time.time()
        assert await_update(server.url, health["policy_version"], settle_s=300) is False
        assert time.time() - t0 < 60  # told by the trainer, not by the 300 s settle time
    finally:
        server.stop()


def test_llm_users_and_rater_at_an_openai_url(make_gateway, tmp_path):
    """Users and rater played by a served model (here the random test model behind a clawloop gateway:
    what it says is noise, which the rater parse must survive). Their calls are side turns."""
    policy, llm = make_gateway(), make_gateway()
    out = tmp_path / "llm.json"
    rc = eval_main(["--personas", "teacher", "--url", policy.url, "--train-updates", "0", "--problems", "3",
                    "--samples-per-problem", "2", "--user-model-url", llm.url + "/v1", "--rater-url", llm.url,
                    "--rater-votes", "2", "--max-tokens", "8", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    p = res["personas"]["teacher"]
    assert res["problem_set"] == "word" and p["user"] == "llm" and p["rater"] == "llm"
    assert p["rater_calls"] == 3 * 2 * 2  # problems x samples x votes
    assert p["rated"] + (p["rater_invalid"] > 0) >= 1 and p["rated"] <= p["asked"] == 3 * 2
    # each problem asked twice with the same opening (the user's words), two seeds
    assert [a["opening"] for a in p["answers_before"]][::2] == [a["opening"] for a in p["answers_before"]][1::2]
    words = {r["question"] for r in _jsonl("data/eval_word_problems.jsonl")}
    assert all(a["question"] in words for a in p["answers_before"])
    # openings were written by the user model, not copied from the problem
    assert all(a["opening"] != a["question"] for a in p["answers_before"])
    llm.store.flush()
    assert llm.store.turns_to_judge("offline", 100) == []   # the simulation's own calls are never trained on
    # posted to the policy's dashboard, since --url is a clawloop
    listed = httpx.get(policy.url + "/api/results").json()["data"]
    assert listed and listed[0]["kind"] == "eval" and listed[0]["name"].startswith("persona teacher, ")
    assert "(llm users" in listed[0]["name"]


@pytest.mark.slow
def test_checkpoint_tasks_and_posting_to_a_dashboard(random_model_dir, gateway, tmp_path):
    out = tmp_path / "ckpt.json"
    r = run_cli("eval", "--model-path", str(random_model_dir), "--eval-tasks", "conversation,coding,tool-use",
                "--personas", "student", "--problems", "3", "--samples-per-problem", "2", "--coding-problems", "3",
                "--tool-use-tasks", "2",
                "--code-max-tokens", "16", "--post-url", gateway.url, "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    rec = res["models"][str(random_model_dir)]
    assert rec["conversation"]["student"]["asked"] == 3 * 2  # problems x samples
    assert rec["coding"]["problems"] == 3 and 0.0 <= rec["coding"]["pass@1"] <= 1.0
    assert rec["tool-use"]["episodes"] == 2
    assert "task=coding pass@1=" in r.stdout and "task=tool-use success=" in r.stdout
    listed = httpx.get(gateway.url + "/api/results").json()["data"]
    assert listed[0]["name"] == f"checkpoint {random_model_dir}"
    assert "coding pass@1" in listed[0]["summary"]


def test_bad_flags_name_the_flag():
    r = run_cli("eval", "--eval-tasks", "conversation,poetry")
    assert r.returncode == 2 and "--eval-tasks" in r.stderr and "poetry" in r.stderr
    r = run_cli("eval", "--personas", "pirate")
    assert r.returncode == 2 and "--personas" in r.stderr
    r = run_cli("eval", "--samples-per-problem", "0")
    assert r.returncode == 2 and "--samples-per-problem" in r.stderr


def test_a_data_dir_that_holds_a_run_is_refused(tmp_path):
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "clawloop.db").write_bytes(b"")
    r = run_cli("eval", "--personas", "student,teacher", "--data-dir", str(tmp_path))
    assert r.returncode == 2 and "--data-dir" in r.stderr and "teacher" in r.stderr and "already holds" in r.stderr
    assert (tmp_path / "teacher" / "clawloop.db").read_bytes() == b""  # nothing touched


def test_demo_url_posts_its_curve(gateway, tmp_path, capsys):
    from clawloop.demo import main as demo_main

    rc = demo_main(["--url", gateway.url, "--updates", "0", "--eval-questions", "4", "--out",
                    str(tmp_path / "demo.json")])
    assert rc == 0
    out = capsys.readouterr()
    assert "learning curve posted" in out.out and "warning" not in out.err
    listed = httpx.get(gateway.url + "/api/results").json()["data"]
    assert listed[0]["kind"] == "demo" and listed[0]["curve"][0]["updates"] == 0
    assert listed[0]["summary"]["baseline"] == json.loads((tmp_path / "demo.json").read_text())["baseline"]

"""Generator files: discovery and its errors, the template, a generator written the way
slime's README says (copy the template, change TASK_TYPE, implement run_rollout that
posts to /buffer/write) running unchanged in its own stoppable process, hooks from a
file, and unit tests of the built-in math generator against a stub OpenAI endpoint."""

from __future__ import annotations

import json
import os
import socket
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from clawloop.buffer import BufferSource, BufferThread, GeneratorError, discover_generators, write_generator_template
from clawloop.buffer.discovery import TEMPLATE_PATH
from clawloop.config import load_config
from clawloop.generators.math_generator import MathRollout, extract_answer, score_answer


def buffer_cfg(data_dir, generator_dir=None, group_size=4, **buffer):
    cfg = load_config({"data_dir": str(data_dir)}, env={})
    cfg.buffer.port = 0
    cfg.buffer.generator_dir = str(generator_dir or "")
    cfg.train.n_samples_per_prompt = group_size
    for k, v in buffer.items():
        setattr(cfg.buffer, k, v)
    return cfg


@pytest.fixture
def make_buffer(tmp_path):
    made = []

    def _make(generator_dir=None, **kw):
        srv = BufferThread(buffer_cfg(tmp_path / f"data{len(made)}", generator_dir, **kw)).start()
        made.append(srv)
        return srv, httpx.Client(base_url=srv.url, timeout=30)

    yield _make
    for srv in made:
        if srv.thread.is_alive():
            srv.stop()


def wait_for(fn, timeout=60.0, every=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("condition not met in time")


def gen_file(d: Path, name: str, body: str) -> Path:
    p = d / name
    p.write_text(textwrap.dedent(body))
    return p


class ByteTokenizer:
    """A chat template over bytes: enough to check prompt/response splitting."""

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False):
        s = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return s + ("<|assistant|>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return list(text.encode())


# -- discovery --------------------------------------------------------------------------------
def test_builtin_math_is_always_found():
    gens = discover_generators(None)
    assert "math" in gens and gens["math"].builtin and gens["math"].custom_hooks == ()


def test_template_is_a_working_generator_file(tmp_path):
    p = write_generator_template("coding", tmp_path)
    assert p == tmp_path / "coding_generator.py"
    assert 'TASK_TYPE = "coding"' in p.read_text()
    gens = discover_generators(tmp_path)
    assert gens["coding"].path == p.resolve() and not gens["coding"].builtin
    with pytest.raises(FileExistsError):
        write_generator_template("coding", tmp_path)
    with pytest.raises(ValueError):
        write_generator_template("bad name!", tmp_path)


def test_discovery_errors_name_the_files(tmp_path):
    a = gen_file(tmp_path, "a_generator.py", 'TASK_TYPE = "dup"\ndef run_rollout(data): pass\n')
    b = gen_file(tmp_path, "b_generator.py", 'TASK_TYPE = "dup"\ndef run_rollout(data): pass\n')
    c = gen_file(tmp_path, "c_generator.py", 'def run_rollout(data): pass\n')
    d = gen_file(tmp_path, "d_generator.py", 'TASK_TYPE = "d"\n')
    e = gen_file(tmp_path, "e_generator.py", 'import no_such_module_xyz\n')
    f = gen_file(tmp_path, "f_generator.py", 'TASK_TYPE = "f"\ndef run_rollout(data): pass\n'
                                              'def pad_group_data(batch): return batch\n')
    gen_file(tmp_path, "helpers.py", "x = 1\n")  # not *_generator.py: ignored
    with pytest.raises(GeneratorError) as ei:
        discover_generators(tmp_path)
    msg = str(ei.value)
    assert f"duplicate TASK_TYPE 'dup' in {a.resolve()} and {b.resolve()}" in msg
    assert f"{c.resolve()}: does not define TASK_TYPE" in msg
    assert f"{d.resolve()}: does not define run_rollout" in msg
    assert f"{e.resolve()}: import failed: ModuleNotFoundError" in msg
    assert f"{f.resolve()}: pad_group_data must accept 2 positional argument(s)" in msg
    assert "helpers.py" not in msg


def test_broken_generator_dir_fails_start_and_start_rollout(tmp_path, make_buffer):
    gen_file(tmp_path, "x_generator.py", 'def run_rollout(data): pass\n')
    with pytest.raises(GeneratorError, match="x_generator.py: does not define TASK_TYPE"):
        BufferThread(buffer_cfg(tmp_path / "d", tmp_path))
    good = tmp_path / "good"
    good.mkdir()
    srv, c = make_buffer(good)
    gen_file(good, "late_generator.py", 'TASK_TYPE = "math"\n')  # broken file added while running
    r = c.post("/start_rollout", json={"task_type": "math"})
    assert r.status_code == 500 and "late_generator.py: does not define run_rollout" in r.json()["message"]


def test_user_generator_replaces_builtin(tmp_path):
    p = gen_file(tmp_path, "mymath_generator.py", 'TASK_TYPE = "math"\ndef run_rollout(data): pass\n')
    gens = discover_generators(tmp_path)
    assert gens["math"].path == p.resolve() and not gens["math"].builtin


# -- a generator written the slime way, run by the buffer ----------------------------------------
SLIME_STYLE_RUN = '''

# --- what the user wrote: run_rollout posts trajectories to /buffer/write -----------------
import urllib.request


def run_rollout(data):
    group_size = int(data["num_repeat_per_sample"])           # slime's trainer sends strings
    with open(data["input_file"]) as f:
        problems = [json.loads(line) for line in f if line.strip()]
    for i, p in enumerate(problems):
        for k in range(group_size):
            answer = str(p["label"]) if k % 2 == 0 else "wrong"
            item = {
                "uid": str(uuid.uuid4()),
                "instance_id": p.get("instance_id", i),
                "messages": [{"role": "user", "content": p["prompt"]},
                             {"role": "assistant", "content": answer}],
                "reward": compute_reward(answer, p["label"]),
                "extra_info": {"k": k},
            }
            req = urllib.request.Request(data["remote_buffer_url"].rstrip("/") + "/buffer/write",
                                         data=json.dumps(item).encode(),
                                         headers={"Content-Type": "application/json"})
            assert urllib.request.urlopen(req).status == 200


def is_valid_group(group_data, min_valid_group_size, task_type):   # slime's signature
    instance_id, items = group_data
    is_finished = len(items) >= min_valid_group_size
    return is_finished and any(it["reward"] > 0 for it in items), is_finished
'''


def test_slime_style_generator_runs_unchanged(tmp_path, make_buffer):
    gdir = tmp_path / "generators"
    gdir.mkdir()
    src = TEMPLATE_PATH.read_text().replace('TASK_TYPE = "my_task"', 'TASK_TYPE = "echo"')
    (gdir / "echo_generator.py").write_text(src + SLIME_STYLE_RUN)
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"prompt": f"What is {i}+1?", "label": str(i + 1)}) + "\n"
                                for i in range(3)))
    srv, c = make_buffer(gdir, group_size=2)
    gens = c.get("/buffer/stats").json()["data"]["data"][0]["generators"]
    assert gens["echo"]["custom_hooks"] == ["is_valid_group"]
    payload = {  # what slime's rollout_buffer_example.py sends
        "num_process": "100", "num_epoch": "1", "remote_engine_url": "http://127.0.0.1:9/",
        "remote_buffer_url": srv.url, "task_type": "echo", "input_file": str(problems),
        "num_repeat_per_sample": "4", "max_tokens": "64",
        "sampling_params": {"max_tokens": 64, "temperature": 1.0, "top_p": 1.0},
        "tokenizer_path": "unused", "skip_instance_ids": [],
    }
    started = c.post("/start_rollout", json=payload).json()
    assert started["success"] and started["message"] == "Rollout started" and started["data"]["group_size"] == 4

    def finished():
        rolls = c.get("/buffer/stats").json()["data"]["data"][0]["rollouts"]
        return rolls and rolls[0]["state"] != "running" and rolls[0]
    roll = wait_for(finished)
    assert roll["state"] == "finished", Path(roll["log"]).read_text()

    source = BufferSource(srv.url, ByteTokenizer())
    samples = source.pull()
    assert len(samples) == 12 and {s.group_id for s in samples} == {"0", "1", "2"}
    assert source.stats["buffer/retokenized"] == 12  # messages only: re-tokenized, and counted
    for s in samples:
        assert s.reward in (0.0, 1.0) and s.advantages[-1] == pytest.approx(s.reward - 0.5)
        assert bytes(s.tokens[:s.prompt_len]).decode().endswith("<|assistant|>")
    st = c.get("/buffer/stats").json()["data"]["data"][0]
    assert st["per_task"]["echo"]["written"] == 12 and st["total_read"] == 12


def test_stop_rollout_stops_the_generator_and_its_workers(tmp_path, make_buffer):
    gdir = tmp_path / "g"
    gdir.mkdir()
    pid_file = tmp_path / "worker.pid"
    gen_file(gdir, "sleepy_generator.py", f'''
        import subprocess, sys, time
        TASK_TYPE = "sleepy"
        def run_rollout(data):
            worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open({str(pid_file)!r}, "w").write(str(worker.pid))
            time.sleep(600)
    ''')
    srv, c = make_buffer(gdir)
    assert c.post("/start_rollout", json={"task_type": "sleepy"}).json()["success"]
    wait_for(pid_file.exists)
    worker_pid = int(wait_for(lambda: pid_file.read_text().strip()))
    again = c.post("/start_rollout", json={"task_type": "sleepy"})
    assert again.status_code == 409
    stopped = c.post("/stop_rollout", json={"task_type": "sleepy"}).json()["data"]["stopped"]
    assert [s["state"] for s in stopped] == ["stopped"]

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie awaiting its (dead) parent's reaper counts as gone
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        except FileNotFoundError:
            return True
    assert gone(stopped[0]["pid"])
    wait_for(lambda: gone(worker_pid), timeout=10)


def test_stop_rollout_leaves_no_agent_workspace_behind(tmp_path, make_buffer):
    """The built-in toolcall generator stopped with episodes in flight (their model calls hang on an
    endpoint that never answers): every environment's workspace is removed, not left in the work dir."""
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)  # accepts connections (the kernel's backlog), never answers
    work = tmp_path / "work"
    work.mkdir()
    srv, c = make_buffer()
    try:
        url = f"http://127.0.0.1:{hang.getsockname()[1]}/v1"
        assert c.post("/start_rollout", json={
            "task_type": "toolcall", "remote_engine_url": url, "task_ids": ["math-000", "math-001"],
            "num_repeat_per_sample": 2, "num_process": 4, "sandbox": "none", "allow_unsandboxed": True,
            "work_dir": str(work)}).json()["success"]
        wait_for(lambda: len(list(work.iterdir())) >= 4, timeout=60)  # four episodes hold an environment
        stopped = c.post("/stop_rollout", json={"task_type": "toolcall"}).json()["data"]["stopped"]
        assert [s["state"] for s in stopped] == ["stopped"]
        assert list(work.iterdir()) == []
    finally:
        hang.close()


def test_a_failing_hook_drops_the_group_loudly(tmp_path, make_buffer):
    gdir = tmp_path / "g"
    gdir.mkdir()
    gen_file(gdir, "broken_generator.py", '''
        TASK_TYPE = "broken"
        def run_rollout(data): pass
        def normalize_group_data(group, epsilon=1e-8, algo="grpo"):
            raise RuntimeError("boom")
    ''')
    srv, c = make_buffer(gdir, group_size=2)
    c.post("/buffer/write_batch", json=[{"instance_id": 1, "reward": float(k), "messages": [], "task_type": "broken"}
                                        for k in range(2)]).raise_for_status()
    got = c.post("/get_rollout_data", json={}).json()
    assert got["success"] is False
    assert "normalize_group_data raised RuntimeError: boom" in got["data"]["meta_info"]["dropped_reasons"][0]
    assert c.get("/buffer/stats").json()["data"]["data"][0]["hook_errors"] == 1


# -- math generator: unit tests of scoring and of its HTTP handling, against a stub ----------------
@pytest.mark.parametrize("text,label,reward", [
    ("12+7=19", "19", 1.0),
    ("The answer is 19.", 19, 1.0),
    ("I think \\boxed{19} is right, not 20", "19", 1.0),
    ("19 or maybe 20", "19", 0.0),
    ("5-9 = -4", "-4", 1.0),
    ("It is 1,024", "1024", 1.0),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("0.5", "1/2", 1.0),
    ("no idea", "3", 0.0),
    ("", "3", 0.0),
])
def test_math_unit_score_answer(text, label, reward):
    assert score_answer(text, label) == reward


def test_math_unit_extract_answer():
    assert extract_answer("a \\boxed{x+{1}} b") == "x+{1}"
    assert extract_answer("3 then 4.5") == "4.5"
    assert extract_answer(None) is None


class StubOpenAI:
    """An OpenAI-shaped chat endpoint on 127.0.0.1 with clawloop's token fields.

    Replies are scripted per call: "fail" (HTTP 500), "cut" (finish_reason length after 2
    tokens while the policy version moves 3 -> 4), or "ok"."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            with self.lock:
                self.requests.append({"headers": dict(request.headers), "body": body})
                step = self.script.pop(0) if self.script else "ok"
            prompt = [1, 2, 3]
            if body.get("continue_final_message"):
                prompt = [1, 2, 3, 40, 41]  # prompt + the ids generated so far: an exact continuation
            if step == "fail":
                return JSONResponse({"error": {"message": "engine restarting"}}, status_code=500)
            if step == "cut":
                return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "The an"},
                                                  "finish_reason": "length", "token_ids": [40, 41],
                                                  "token_logprobs": [-0.1, -0.2]}],
                                     "usage": {"completion_tokens": 2}, "prompt_token_ids": prompt,
                                     "policy_version": 3})
            return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "swer is 19"},
                                              "finish_reason": "stop", "token_ids": [42, 43, 2],
                                              "token_logprobs": [-0.3, -0.4, -0.5]}],
                                 "usage": {"completion_tokens": 3}, "prompt_token_ids": prompt,
                                 "policy_version": 4})

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=30, every=0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def test_math_unit_against_stub_endpoint(tmp_path, make_buffer):
    """Parsing, token fields, retry and continuation, against a stub (not the real gateway)."""
    stub = StubOpenAI(["fail", "cut", "ok", "ok"])
    srv, c = make_buffer(group_size=2)
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"instance_id": "q1", "prompt": "What is 12+7?", "label": "19"}) + "\n")
    try:
        counts = MathRollout({
            "task_type": "math", "remote_engine_url": stub.url, "remote_buffer_url": srv.url,
            "input_file": str(problems), "num_repeat_per_sample": "2", "num_process": "1",
            "sampling_params": {"max_tokens": 16, "temperature": 0.7}, "max_retries": 2,
        }).run()
    finally:
        stub.stop()
    assert counts["written"] == 2 and counts["retries"] == 1 and counts["continuations"] == 1
    first = stub.requests[0]
    assert first["headers"]["x-turn-type"] == "side"
    assert first["body"]["return_token_ids"] is True and first["body"]["max_tokens"] == 16
    assert first["body"]["temperature"] == 0.7
    cont = stub.requests[2]["body"]
    assert cont["continue_final_message"] is True and cont["max_tokens"] == 14
    assert cont["messages"][-1] == {"role": "assistant", "content": "The an"}

    got = c.post("/get_rollout_data", json={}).json()
    assert got["success"] is False  # both answers say 19: a constant group is not valid...
    assert c.get("/buffer/stats").json()["data"]["data"][0]["dropped_invalid_groups"] == 1


def test_math_unit_items_are_token_exact(tmp_path, make_buffer):
    stub = StubOpenAI(["cut", "ok"])
    captured = []
    try:
        roll = MathRollout({"remote_engine_url": stub.url + "/v1", "remote_buffer_url": "http://unused",
                            "input_file": "", "num_repeat_per_sample": 1, "sampling_params": {"max_tokens": 16}})
        roll.send = captured.append
        roll.rollout_one({"instance_id": 5, "prompt": "What is 12+7?", "label": 19})
        roll.rollout_one({"instance_id": 6, "prompt": "What is 1+1?", "label": 2})
    finally:
        stub.stop()
    cut, plain = captured
    assert cut["messages"][-1] == {"role": "assistant", "content": "The answer is 19"} and cut["reward"] == 1.0
    assert cut["prompt_ids"] == [1, 2, 3] and cut["response_ids"] == [40, 41, 42, 43, 2]
    assert cut["response_logprobs"] == [-0.1, -0.2, -0.3, -0.4, -0.5]
    assert cut["policy_version"] == 3 and cut["extra_info"]["policy_versions"] == [3, 4]
    assert cut["extra_info"]["continuations"] == 1 and cut["extra_info"]["token_exact"] is True
    assert plain["reward"] == 0.0 and plain["extra_info"]["pred"] == "19" and plain["task_type"] == "math"
    sample = BufferSource("http://unused").to_samples([cut])[0]
    assert sample.tokens == [1, 2, 3, 40, 41, 42, 43, 2] and sample.loss_mask == [0, 0, 0, 1, 1, 1, 1, 1]
    assert sample.policy_version == 3


def test_math_problem_file_ships_and_parses():
    from clawloop.generators.math_generator import DEFAULT_INPUT_FILE, read_problems

    problems = read_problems(DEFAULT_INPUT_FILE)
    assert 80 <= len(problems) <= 120
    assert len({p["instance_id"] for p in problems}) == len(problems)
    for p in problems:
        assert p["prompt"].startswith("What is ") and score_answer(p["label"], p["label"]) == 1.0


def test_template_run_rollout_works_against_a_stub_endpoint(tmp_path, make_buffer):
    """The template as written (before the user edits it) already produces valid items."""
    from clawloop.buffer.discovery import load_module

    module = load_module(write_generator_template("tmpl", tmp_path))
    stub = StubOpenAI([])
    srv, c = make_buffer(group_size=2)
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"prompt": "What is 12+7?", "label": "swer is 19"}) + "\n")
    try:
        module.run_rollout({"remote_engine_url": stub.url, "remote_buffer_url": srv.url, "task_type": "tmpl",
                            "input_file": str(problems), "num_repeat_per_sample": "2", "num_process": "2",
                            "sampling_params": {"max_tokens": 8}})
    finally:
        stub.stop()
    assert stub.requests[0]["headers"]["x-turn-type"] == "side"
    st = c.get("/buffer/stats").json()["data"]["data"][0]
    assert st["total_written"] == 2 and st["ready_groups"] == 1
    c.post("/get_rollout_data", json={})  # a constant group (both right): dropped as invalid, counted
    assert c.get("/buffer/stats").json()["data"]["data"][0]["dropped_invalid_groups"] == 1


def test_math_unit_skip_instance_ids(tmp_path):
    problems = tmp_path / "p.jsonl"
    problems.write_text("".join(json.dumps({"instance_id": i, "prompt": f"What is {i}+0?", "label": i}) + "\n"
                                for i in range(2)))
    stub = StubOpenAI([])
    sent = []
    try:
        roll = MathRollout({"remote_engine_url": stub.url, "remote_buffer_url": "http://unused",
                            "input_file": str(problems), "num_repeat_per_sample": 2, "num_process": 1,
                            "num_epoch": 2, "skip_instance_ids": [0]})
        roll.send = sent.append
        counts = roll.run()
    finally:
        stub.stop()
    # instance 0 finished before a restart: skipped once (one group), then sampled in epoch 2
    assert counts["skipped_groups"] == 1
    assert [it["instance_id"] for it in sent].count(0) == 2 and [it["instance_id"] for it in sent].count(1) == 4


# -- plugin functions: --custom-generate-function-path and --rollout-function-path ----------------
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "plugins"

PLUGIN_FNS = '''
TASK_TYPE = "tiny_task"

def text_only(messages, sampling_params):           # clawloop's generate signature
    return "The answer is 19" if "12+7" in messages[-1]["content"] else "no idea"

def one_arg(messages):
    return "x"

def two_args(data, extra):
    pass

def run(data):                                        # a rollout function
    import httpx
    for k in range(int(data["num_repeat_per_sample"])):
        httpx.post(data["remote_buffer_url"] + "/buffer/write",
                   json={"instance_id": "a", "reward": 0.25 * k, "messages": [{"role": "user", "content": "hi"}]})

def is_valid_group(group_data, min_valid_group_size, task_type):
    return len(group_data[1]) >= min_valid_group_size, len(group_data[1]) >= min_valid_group_size
'''


@pytest.fixture
def plugin_fns(tmp_path):
    return gen_file(tmp_path, "fns.py", PLUGIN_FNS)


def test_custom_generate_in_slimes_signature_keeps_items_token_exact(tmp_path):
    """examples/plugins/gateway_generate.py (slime's `generate(args, sample, sampling_params)`) answers for
    the built-in math generator: its own system prompt reaches the server, and the ids and logprobs it
    put on the sample become the item's token fields."""
    stub = StubOpenAI([])
    captured = []
    try:
        roll = MathRollout({"remote_engine_url": stub.url, "remote_buffer_url": "http://unused",
                            "sampling_params": {"max_tokens": 16, "temperature": 0.5},
                            "custom_generate_function_path": str(EXAMPLES / "gateway_generate.py")})
        roll.send = captured.append
        roll.rollout_one({"instance_id": 5, "prompt": "What is 12+7?", "label": 19})
    finally:
        stub.stop()
    (item,) = captured
    body = stub.requests[0]["body"]
    assert body["messages"][0] == {"role": "system", "content": "Answer with the number only."}
    assert body["max_tokens"] == 16 and body["temperature"] == 0.5 and stub.requests[0]["headers"]["x-turn-type"] == "side"
    assert item["messages"][-1]["content"] == "swer is 19" and item["reward"] == 1.0
    assert (item["prompt_ids"], item["response_ids"], item["response_logprobs"]) == ([1, 2, 3], [42, 43, 2],
                                                                                      [-0.3, -0.4, -0.5])
    assert item["policy_version"] == 4 and item["extra_info"]["token_exact"] is True


def test_custom_generate_in_clawloops_signature_and_its_errors(plugin_fns, tmp_path):
    sent = []
    roll = MathRollout({"remote_engine_url": "http://127.0.0.1:9", "remote_buffer_url": "http://unused",
                        "custom_generate_function_path": f"{plugin_fns}:text_only"})
    roll.send = sent.append
    roll.rollout_one({"instance_id": 1, "prompt": "What is 12+7?", "label": 19})
    assert sent[0]["reward"] == 1.0 and "response_ids" not in sent[0] and not sent[0]["extra_info"]["token_exact"]
    from clawloop.plugins import PluginError

    with pytest.raises(PluginError, match=r"--custom-generate-function-path .*one_arg\(messages\) fits no accepted"):
        BufferThread(buffer_cfg(tmp_path / "d", custom_generate_function_path=f"{plugin_fns}:one_arg"))


def test_rollout_function_runs_as_one_more_generator(tmp_path, make_buffer):
    """examples/plugins/reverse_rollout.py through the buffer: discovered beside the built-ins under its
    TASK_TYPE, started by /start_rollout in its own process, its continuous rewards arrive as items."""
    stub = StubOpenAI([])
    try:
        srv, c = make_buffer(group_size=2, rollout_function_path=f"{EXAMPLES / 'reverse_rollout.py'}:run_rollout")
        gens = c.get("/buffer/stats").json()["data"]["data"][0]["generators"]
        assert gens["reverse"]["path"] == str((EXAMPLES / "reverse_rollout.py").resolve()) and "math" in gens
        r = c.post("/start_rollout", json={"task_type": "reverse", "num_repeat_per_sample": 2,
                                           "remote_engine_url": stub.url, "words": ["sie"]})
        assert r.json()["success"], r.text

        def finished():
            rolls = c.get("/buffer/stats").json()["data"]["data"][0]["rollouts"]
            return rolls and rolls[0]["state"] != "running" and rolls[0]
        roll = wait_for(finished)
        assert roll["state"] == "finished", Path(roll["log"]).read_text()
    finally:
        stub.stop()
    got = c.post("/get_rollout_data", json={}).json()
    st = c.get("/buffer/stats").json()["data"]["data"][0]
    assert st["per_task"]["reverse"]["written"] == 2
    # the stub answers "swer is 19" to both: "sie" reversed is "eis" -> 1 of 3 letters in place, both alike,
    # so the group is constant and dropped as invalid (the default hook), not handed out
    assert got["success"] is False and st["dropped_invalid_groups"] == 1


def test_rollout_function_hooks_and_errors(plugin_fns, tmp_path):
    gens = discover_generators(None, rollout_function_path=f"{plugin_fns}:run")
    g = gens["tiny_task"]
    assert g.entry == f"{plugin_fns.resolve()}:run" and g.custom_hooks == ("is_valid_group",) and not g.builtin
    with pytest.raises(GeneratorError, match=r"--rollout-function-path .*two_args\(data, extra\) cannot be called"):
        discover_generators(None, rollout_function_path=f"{plugin_fns}:two_args")
    gdir = tmp_path / "g"
    gdir.mkdir()
    gen_file(gdir, "t_generator.py", 'TASK_TYPE = "tiny_task"\ndef run_rollout(data): pass\n')
    with pytest.raises(GeneratorError, match="duplicate TASK_TYPE 'tiny_task'.*--rollout-function-path"):
        discover_generators(gdir, rollout_function_path=f"{plugin_fns}:run")

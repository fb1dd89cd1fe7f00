"""The SWE track (SWE-bench instances, mini-swe-agent v1 protocol): fix a bug in a repo, checked by its tests.

    ENV_TYPE=swe [--task-dir SWE_BENCH_PATH]

    env = TRACK.make_env(task, opts, slot=0)
    obs = env.reset()        # the repo at base_commit in a fresh sandboxed workspace; system + PR description
    env.step(message)        # runs its one ```bash block; `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` submits
    env.evaluate()           # the diff on a fresh checkout, FAIL_TO_PASS + PASS_TO_PASS run: +1 resolved, else -1

Tasks: the shipped instances (`clawloop/data/swe_instances.jsonl`, bugs injected
into the small repos of `clawloop/data/swe_repos/` by `clawloop swe make-tasks`),
or with `--task-dir` (SWE_BENCH_PATH) the user's own SWE-bench instances: a
`.jsonl` / `.json` file, or a folder holding `instances.jsonl` (else its
`*.jsonl`). Each needs `instance_id`, `repo`, `base_commit`,
`problem_statement`, `FAIL_TO_PASS` and `PASS_TO_PASS` (lists of test ids,
or JSON strings of them as SWE-bench ships them; the ids pytest's
`file::test`). The repo must be on disk: `repo_path` (relative to the
instances file's folder), else `repos/<name>` or `<name>` beside it, `<name>`
being `repo` with `/` replaced by `__` (or its last part). A git repo is
checked out at `base_commit` (only that commit is copied into the
workspace, so later commits holding the fix are not there to read); a plain
folder works for instances that carry a `bug_patch` (those `make-tasks`
writes), rebuilt as the shipped ones are. Tests run with
`clawloop.envs.testrun`, which covers plain `test_*` functions and
`unittest` classes, not pytest fixtures or parametrisation.

Protocol (mini-swe-agent v1): no tools; every assistant message must hold
exactly one ```bash (or ```sh) block, run as `bash -c` in a new subshell in the
repo (nothing persists between commands but files), answered by a user
message `<returncode>N</returncode><output>...</output>` (long output keeps
its head and tail). Anything else gets the format-error message (the step
counts). A command starting with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
(not run), or whose output's first line is that word, submits: the episode
ends and the patch is the workspace's diff against base_commit (new files
included, binary files left out). `max_steps` without a submission also ends
the episode; its diff is still evaluated, but an unsubmitted episode is
unresolved (-1), as in the reference.

Evaluation is SWE-bench's: a fresh checkout at base_commit, the patch applied
with `git apply` (not applying: unresolved), the test files named by the test
ids put back as they were at base_commit (editing tests cannot help), then
FAIL_TO_PASS and PASS_TO_PASS run; resolved when every one passes.

In the bwrap sandbox the instances (they hold the fixes) are hidden from the
agent; at the weaker `unshare` level the host's files stay readable.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from clawloop.envs.swe import repos
from clawloop.envs.base import Env, EnvOptions, Evaluation, Observation, StepResult, Task, Track
from clawloop.envs.sandbox import Limits, Result, Sandbox

SHIPPED = repos.INSTANCES_FILE
REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MAX_OBSERVATION = 10_000
"""Characters of output shown whole; longer output shows its first and last half of this (mini-swe-agent's)."""
MAX_PATCH_BYTES = 1 << 20
DIFF_TIMEOUT_S = 60.0
_ACTION = re.compile(r"```(?:bash|sh)\s*\n(.*?)\n```", re.DOTALL)
_SUBMIT_COMMAND = re.compile(r"^\s*echo\s+['\"]?" + SUBMIT + r"\b")
_HEREDOC = "CLAWLOOP_PATCH_EOF"

SYSTEM_PROMPT = """You are a helpful assistant that can interact multiple times with a computer shell to solve \
programming tasks.
Your response must contain exactly ONE bash code block with ONE command (or commands connected with && or ||).

Include a THOUGHT section before your command where you explain your reasoning process.
Format your response as shown in <format_example>.

<format_example>
THOUGHT: Your reasoning and analysis here

```bash
your_command_here
```
</format_example>

Failure to follow these rules will cause your response to be rejected."""

INSTANCE_TEMPLATE = """<pr_description>
Consider the following PR description:
{task}
</pr_description>

<instructions>
# Task Instructions

## Overview
You're a software engineer interacting continuously with a computer by submitting commands.
You'll be helping implement necessary changes to meet requirements in the PR description.
Your task is specifically to make changes to non-test files in the current directory in order to fix the issue \
described in the PR description in a way that is general and consistent with the codebase.

IMPORTANT: This is an interactive process where you will think and issue ONE command, see its result, then think \
and issue your next command.

## Important Boundaries
- MODIFY: Regular source code files in {cwd}
- DO NOT MODIFY: Tests, configuration files (changes to tests are thrown away before your fix is checked)

## Recommended Workflow
1. Analyze the codebase by finding and reading relevant files
2. Create a script to reproduce the issue
3. Edit the source code to resolve the issue
4. Verify your fix works by running your script again
5. Test edge cases to ensure your fix is robust

## Command Execution Rules
- Each command runs in a new subshell in {cwd}: directory and environment variable changes are not \
persistent (prefix a command with `cd DIR && ...` where needed); files you write stay.
- A command may run for at most {timeout:g} seconds. There is no network.
- Avoid interactive tools (vi, nano, less, a bare python prompt); edit files with sed, cat <<'EOF' > file, or a \
python script.
- The repository is a git repository at the commit under test.
- Run the tests with `python3 -m clawloop.envs.testrun {tests}` (add `-k TEST_ID` to run one test).

## Submission
When you've completed your work (reading, editing, testing) and cannot make further progress, issue exactly the \
following command, alone:

```bash
echo {submit}
```

This submits your changes (the diff of the repository against the commit under test). Nothing after it runs, \
and you cannot continue working on this task after submitting.
</instructions>"""

FORMAT_ERROR = """Please always provide EXACTLY ONE action in triple backticks, found {n} actions.

Please format your action in triple backticks as shown in <response_example>.

<response_example>
Here are some thoughts about why you want to perform the action.

```bash
<action>
```
</response_example>

If you have completed your assignment, please consult the first message about how to
submit your solution (you will not be able to continue working on this task after that)."""

TIMEOUT_TEMPLATE = """The last command <command>{command}</command> timed out and has been killed.
The output of the command was:
<output>
{output}
</output>
Please try another command and make sure to avoid those requiring interactive input."""

LONG_OUTPUT = """<returncode>{returncode}</returncode>
<warning>
The output of your last command was too long.
Please try a different command that does not produce as much output.
If you're looking at a file you can try use head, tail or sed to view a smaller number of lines selectively.
If you're using grep or find and it produced too much output, you can use a more selective search pattern.
If you really need to see something from the full command's output, you can redirect output to a file and then \
search in that file.
</warning><output_head>
{head}
</output_head>
<elided_chars>
{elided} characters elided
</elided_chars>
<output_tail>
{tail}
</output_tail>"""


# ---- instances ---------------------------------------------------------------------------------

def _test_ids(inst: dict[str, Any], key: str, where: str) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as a list, from a list or SWE-bench's JSON string of one."""
    value = inst.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{where}: {key} is a string but not a JSON list: {e}") from e
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ValueError(f"{where}: {key} must be a list of test ids (or a JSON string of one)")
    return value


def _read_instances(path: Path) -> list[dict[str, Any]]:
    where = f"SWE instances {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{where}: cannot read: {e}") from e
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{where}: not JSON: {e}") from e
        items = data if isinstance(data, list) else [data]
    else:
        items = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except ValueError as e:
                    raise ValueError(f"{where}, line {n}: not JSON: {e}") from e
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"{where}: instance #{k + 1} is not a JSON object")
    return items


def _instance_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ValueError(f"SWE task dir {root}: no such file or folder")
    if (root / "instances.jsonl").is_file():
        return [root / "instances.jsonl"]
    files = sorted(root.glob("*.jsonl"))
    if not files:
        raise ValueError(f"SWE task dir {root}: no instances.jsonl or *.jsonl in it")
    return files


def _shipped_repo(inst: dict[str, Any]) -> Path | None:
    owner, _, name = str(inst.get("repo", "")).partition("/")
    p = repos.REPOS_DIR / name
    return p if owner == "clawloop" and name and p.is_dir() else None


def _find_repo(inst: dict[str, Any], base_dir: Path, where: str) -> Path:
    if inst.get("repo_path"):
        p = (base_dir / str(inst["repo_path"])).resolve()
        if not p.is_dir():
            raise ValueError(f"{where}: repo_path {p} is not a folder")
        return p
    repo = str(inst["repo"])
    names = list(dict.fromkeys([repo.replace("/", "__"), repo.rstrip("/").split("/")[-1]]))
    tried = [base_dir / sub / n for n in names for sub in ("repos", "")]
    for p in tried:
        if p.is_dir():
            return p.resolve()
    shipped = _shipped_repo(inst) if inst.get("bug_patch") else None
    if shipped is not None:
        return shipped
    raise ValueError(f"{where}: unknown repo {repo!r}: none of {', '.join(str(p) for p in tried)} is a folder "
                     f"(or give the instance a repo_path)")


def user_task(inst: dict[str, Any], base_dir: Path, source: str) -> Task:
    """One user instance as a Task; ValueError naming the instance and what is wrong."""
    iid = inst.get("instance_id")
    where = f"SWE instance {iid!r} ({source})" if isinstance(iid, str) and iid else f"SWE instance in {source}"
    missing = [k for k in REQUIRED if k not in inst or inst[k] in (None, "")]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    for k in ("instance_id", "repo", "base_commit", "problem_statement"):
        if not isinstance(inst[k], str):
            raise ValueError(f"{where}: {k} must be a string")
    if not _test_ids(inst, "FAIL_TO_PASS", where):
        raise ValueError(f"{where}: FAIL_TO_PASS is empty (nothing would show the fix)")
    _test_ids(inst, "PASS_TO_PASS", where)
    repo = _find_repo(inst, base_dir, where)
    if (repo / ".git").exists():
        try:
            repos.git(repo, "cat-file", "-e", f"{inst['base_commit']}^{{commit}}")
        except RuntimeError as e:
            raise ValueError(f"{where}: base_commit {inst['base_commit']} is not a commit of {repo}") from e
    elif not inst.get("bug_patch"):
        raise ValueError(f"{where}: repo folder {repo} is not a git repository")
    return Task(task_id=inst["instance_id"], track="swe", instruction=inst["problem_statement"],
                data={**inst, "repo_path": str(repo)})


class SWETrack(Track):
    name = "swe"

    def load_tasks(self, opts: EnvOptions) -> list[Task]:
        """The shipped instances, or with `opts.task_dir` the user's (see the module docstring)."""
        if not opts.task_dir:
            return [Task(task_id=i["instance_id"], track="swe", instruction=i["problem_statement"], data=i)
                    for i in _read_instances(SHIPPED)]
        tasks: dict[str, Task] = {}
        for path in _instance_files(Path(opts.task_dir).expanduser().resolve()):
            for inst in _read_instances(path):
                task = user_task(inst, path.parent, str(path))
                if task.task_id in tasks:
                    raise ValueError(f"SWE instance {task.task_id!r} ({path}): instance_id used twice")
                tasks[task.task_id] = task
        if not tasks:
            raise ValueError(f"SWE task dir {opts.task_dir}: no instances in it")
        return list(tasks.values())

    def make_env(self, task: Task, opts: EnvOptions, *, slot: int = 0) -> "SWEEnv":
        return SWEEnv(task, opts, slot=slot)


TRACK = SWETrack()


def checkout(data: dict[str, Any], dest: Path) -> None:
    """The instance's repo at base_commit as a new git repo in `dest` (host side, before any agent runs there)."""
    base = data["base_commit"]
    src = Path(data["repo_path"]) if data.get("repo_path") else _shipped_repo(data)
    if src is None:
        raise ValueError(f"SWE instance {data.get('instance_id')!r}: unknown repo {data.get('repo')!r}")
    if (src / ".git").exists():
        # Only base_commit comes over: commits after it (the fix) must not be in the workspace to read.
        repos.git(dest, "init", "-q", "-b", "main")
        repos.git(dest, "fetch", "-q", "--no-tags", "--depth=1", "--upload-pack",
                      "git -c uploadpack.allowAnySHA1InWant=true upload-pack", str(src), base)
        repos.git(dest, "checkout", "-q", "-B", "main", base)
        return
    sha = repos.build_base(src, dest, data["bug_patch"])
    if sha != base:
        raise RuntimeError(f"SWE instance {data.get('instance_id')!r}: rebuilt base commit {sha} is not base_commit "
                           f"{base}: the repo's files changed since the instances were made; run "
                           f"`clawloop swe make-tasks` again")


def _read_private(path: Path, limit: int) -> bytes | None:
    """A file the sandbox wrote, read without following a link the agent may have planted; None when it is
    missing, not a regular file, or over `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _drop_binary(patch: str) -> str:
    """The patch without its binary files' sections (a text diff cannot carry them)."""
    parts = re.split(r"(?m)^(?=diff --git )", patch)
    return "".join(p for p in parts if not re.search(r"(?m)^(Binary files .* differ|GIT binary patch)$", p))


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")


class SWEEnv(Env):
    track = "swe"

    def __init__(self, task: Task, opts: EnvOptions, *, slot: int = 0):
        super().__init__(task, opts, slot=slot)
        self.instance = task.data
        where = f"SWE instance {task.task_id!r}"
        self.fail_to_pass = _test_ids(task.data, "FAIL_TO_PASS", where)
        self.pass_to_pass = _test_ids(task.data, "PASS_TO_PASS", where)
        self.workspace: Path | None = None
        self.sandbox: Sandbox | None = None
        self.patch: str | None = None
        """The submission: the workspace's diff against base_commit once the episode ended."""
        self.patch_error = ""
        self.submitted = False
        self.end_reason = ""
        self._done = False

    # -- lifecycle --

    def _new_workspace(self, what: str) -> Path:
        if self.opts.work_dir:
            Path(self.opts.work_dir).mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.task.task_id)[:60]
        return Path(tempfile.mkdtemp(prefix=f"clawloop-swe-{what}-{safe}-", dir=self.opts.work_dir or None))

    def _sandbox(self, workspace: Path) -> Sandbox:
        # Sandbox hides clawloop's data (the shipped instances hold the fixes); a user's instances too.
        hide = []
        if self.opts.task_dir:
            td = Path(self.opts.task_dir).expanduser().resolve()
            hide.append(td if td.is_dir() else td.parent)
        # Git in the sandbox runs as the sandbox user on its own files; safe.directory covers any level.
        git_ok = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
        return Sandbox(workspace, level=self.opts.sandbox, allow_unsandboxed=self.opts.allow_unsandboxed,
                       limits=Limits(memory_mb=self.opts.memory_mb, disk_mb=self.opts.disk_mb), slot=self.slot,
                       env=git_ok, hide=hide)

    def reset(self) -> Observation:
        self.close()
        self.steps, self._done, self.submitted = 0, False, False
        self.patch, self.patch_error, self.end_reason = None, "", ""
        self.workspace = self._new_workspace("ws")
        try:
            checkout(self.instance, self.workspace)
            self.sandbox = self._sandbox(self.workspace)  # gives the workspace to the sandbox user
        except BaseException:
            self.close()
            raise
        files = sorted({t.split("::")[0] for t in self.fail_to_pass + self.pass_to_pass})
        user = INSTANCE_TEMPLATE.format(task=self.task.instruction.strip(), cwd=self.sandbox.cwd,
                                        timeout=self.opts.command_timeout_s, submit=SUBMIT,
                                        tests=" ".join(shlex.quote(f) for f in files) or "tests/test_x.py")
        return Observation(messages=[{"role": "system", "content": SYSTEM_PROMPT},
                                     {"role": "user", "content": user}], tools=None)

    def close(self) -> None:
        if self.workspace is not None and not self.opts.keep_workspaces:
            shutil.rmtree(self.workspace, ignore_errors=True)
        self.workspace = None
        self.sandbox = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "instance_id": self.instance.get("instance_id"),
                "repo": self.instance.get("repo"), "sandbox": self.sandbox.describe() if self.sandbox else None}

    def oracle(self) -> list[dict[str, Any]]:
        patch = self.instance.get("patch") or ""
        if not patch.strip():
            raise ValueError(f"SWE instance {self.task.task_id!r} has no gold patch")
        if not patch.endswith("\n"):
            patch += "\n"
        if "```" in patch or _HEREDOC in patch:  # it could not sit in a heredoc inside a code block
            command = f"echo {base64.b64encode(patch.encode()).decode()} | base64 -d | git apply --whitespace=nowarn"
        else:
            command = f"git apply --whitespace=nowarn <<'{_HEREDOC}'\n{patch}{_HEREDOC}"
        return [{"role": "assistant", "content": f"THOUGHT: Apply the reference fix.\n\n```bash\n{command}\n```"},
                {"role": "assistant",
                 "content": f"THOUGHT: The fix is in place; submitting.\n\n```bash\necho {SUBMIT}\n```"}]

    # -- steps --

    def step(self, message: dict[str, Any]) -> StepResult:
        if self.sandbox is None:
            raise RuntimeError("step() before reset()")
        if self._done:
            return StepResult([], True, {"end_reason": "episode_over", "error": "the episode is over"})
        self.steps += 1
        actions = _ACTION.findall(_content(message))
        info: dict[str, Any] = {"returncode": None, "timed_out": False, "seconds": 0.0}
        if len(actions) != 1:
            info["error"] = f"format error: {len(actions)} bash blocks"
            reply = FORMAT_ERROR.format(n=len(actions))
        else:
            command = actions[0].strip()
            if _SUBMIT_COMMAND.match(command):
                return self._submit(info)
            r = self.sandbox.run(command, timeout_s=self.opts.command_timeout_s)
            info.update(returncode=r.returncode, timed_out=r.timed_out, seconds=round(r.seconds, 3))
            if r.reason:
                info["error"] = r.reason
            lines = r.output.lstrip().splitlines()
            if not r.timed_out and lines and lines[0].strip() == SUBMIT:
                return self._submit(info)
            reply = self._observation(command, r)
        if self.steps >= self.opts.max_steps:
            self._end("max_steps")
            info["end_reason"] = "max_steps"
        return StepResult([{"role": "user", "content": reply}], self._done, info)

    def _observation(self, command: str, r: Result) -> str:
        out = r.output
        if r.timed_out:
            return TIMEOUT_TEMPLATE.format(command=command, output=_clip(out))
        if r.reason:
            out += ("" if not out or out.endswith("\n") else "\n") + f"[{r.reason}]\n"
        if len(out) < MAX_OBSERVATION:
            return f"<returncode>{r.returncode}</returncode>\n<output>\n{out}</output>"
        half = MAX_OBSERVATION // 2
        return LONG_OUTPUT.format(returncode=r.returncode, head=out[:half], tail=out[-half:],
                                  elided=len(out) - 2 * half)

    def _submit(self, info: dict[str, Any]) -> StepResult:
        self.submitted = True
        self._end("submitted")
        info.update(submitted=True, end_reason="submitted", patch_bytes=len((self.patch or "").encode()))
        if self.patch_error:
            info["error"] = self.patch_error
        return StepResult([], True, info)

    def _end(self, reason: str) -> None:
        self._done = True
        self.end_reason = reason
        self.patch, self.patch_error = self._diff()

    def _diff(self) -> tuple[str, str]:
        """(the workspace's diff against base_commit, why it could not be taken). Git runs in the sandbox:
        the repo's config is the agent's to change, and git obeys it."""
        assert self.sandbox is not None and self.workspace is not None
        tag = f".clawloop-{os.urandom(6).hex()}"
        index, out = f"{self.sandbox.cwd}/{tag}.index", f"{tag}.patch"
        base = shlex.quote(self.instance["base_commit"])
        script = (f"export GIT_INDEX_FILE={shlex.quote(index)}; git read-tree {base} && "
                  f"git add -A -- . {shlex.quote(':(exclude)' + tag + '.*')} && "
                  f"git diff --cached --no-color --no-ext-diff --no-textconv {base} > {out}; "
                  f"rc=$?; rm -f {shlex.quote(index)}; exit $rc")
        r = self.sandbox.run(script, timeout_s=DIFF_TIMEOUT_S)
        raw = _read_private(self.workspace / out, MAX_PATCH_BYTES)
        (self.workspace / out).unlink(missing_ok=True)
        if not r.ok:
            return "", f"could not take the diff: {(r.output.strip() or r.reason)[-500:]}"
        if raw is None:
            return "", f"could not take the diff: missing or over {MAX_PATCH_BYTES} bytes"
        return _drop_binary(raw.decode("utf-8", "replace")), ""

    # -- scoring --

    def evaluate(self) -> Evaluation:
        if self.sandbox is None or self.workspace is None:
            raise RuntimeError("evaluate() before reset()")
        if self.patch is None:  # evaluated mid-episode: the diff as it stands, not submitted
            self.patch, self.patch_error = self._diff()
        details: dict[str, Any] = {"instance_id": self.task.task_id, "submitted": self.submitted,
                                   "end_reason": self.end_reason or "not_finished", "patch": self.patch,
                                   "applied": False, "tests": {}, "reason": ""}
        t0 = time.monotonic()
        tests, reason = self._run_tests(details)
        details["seconds"] = round(time.monotonic() - t0, 3)
        passed = bool(tests) and all(r == "passed" for r in tests.values())
        if not reason and not self.submitted:
            reason = f"not submitted (episode ended by {self.end_reason or 'evaluate before the end'})"
        details.update(tests=tests, tests_passed=passed, reason=reason,
                       fail_to_pass={t: tests.get(t, "not run") for t in self.fail_to_pass},
                       pass_to_pass_failed=[t for t in self.pass_to_pass if tests.get(t) != "passed"])
        resolved = passed and self.submitted
        details["resolved"] = resolved
        return Evaluation(reward=1.0 if resolved else -1.0, success=resolved, details=details)

    def _run_tests(self, details: dict[str, Any]) -> tuple[dict[str, str], str]:
        """Apply the patch to a fresh checkout and run the instance's tests: (results by id, failure reason)."""
        if self.patch_error:
            return {}, self.patch_error
        if not (self.patch or "").strip():
            return {}, "empty patch: nothing was changed"
        fresh = self._new_workspace("eval")
        try:
            checkout(self.instance, fresh)
            ids = self.fail_to_pass + self.pass_to_pass
            files = sorted({t.split("::")[0] for t in ids})
            originals = [f for f in files if (fresh / f).is_file()]
            box = self._sandbox(fresh)
            r = box.run("git apply --whitespace=nowarn -", stdin=self.patch, timeout_s=DIFF_TIMEOUT_S)
            if not r.ok:
                return {}, f"patch does not apply: {(r.output.strip() or r.reason)[-1000:]}"
            details["applied"] = True
            if originals:  # SWE-bench resets the test files: the agent's edits to them do not count
                r = box.run(f"git checkout -q {shlex.quote(self.instance['base_commit'])} -- "
                            + " ".join(shlex.quote(f) for f in originals), timeout_s=DIFF_TIMEOUT_S)
                if not r.ok:
                    return {}, f"could not restore the test files: {(r.output.strip() or r.reason)[-500:]}"
            out = f".clawloop-results-{os.urandom(6).hex()}.json"
            r = box.run(f"python3 -m clawloop.envs.testrun {' '.join(shlex.quote(f) for f in files)} --json {out} "
                        + " ".join(f"-k {shlex.quote(t)}" for t in ids), timeout_s=self.opts.command_timeout_s)
            details["test_output_tail"] = r.output[-3000:]
            raw = _read_private(fresh / out, 4 << 20)
            results: dict[str, Any] = {}
            if raw is not None:
                try:
                    loaded = json.loads(raw)
                    results = loaded.get("tests") if isinstance(loaded, dict) else {}
                except ValueError:
                    results = {}
            tests = {t: str(results.get(t, "not run")) if isinstance(results, dict) else "not run" for t in ids}
            failed = [t for t, v in tests.items() if v != "passed"]
            reason = ""
            if r.reason:
                reason = f"tests: {r.reason}"
            elif raw is None:
                reason = "the test run wrote no results"
            elif failed:
                reason = f"{len(failed)} of {len(ids)} tests fail: " + ", ".join(failed[:5])
            return tests, reason
        finally:
            if not self.opts.keep_workspaces:
                shutil.rmtree(fresh, ignore_errors=True)


def _clip(text: str, limit: int = MAX_OBSERVATION) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters elided ...]\n{text[-half:]}"

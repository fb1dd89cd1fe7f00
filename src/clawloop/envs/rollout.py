"""The agent rollout every track's generator runs: multi-step episodes through the gateway.

    run_agent_rollout("terminal", data)     # what terminal_generator.run_rollout(data) does

For each task (× `num_repeat_per_sample`, the GRPO group) an environment is
leased from the pool (local by default, `env_pool_url` for a remote one),
reset, and stepped: each step is one chat call to the gateway with the whole
conversation so far (a side turn with `return_token_ids`, so the step's prompt
ids, response ids, logprobs and policy version are the ones served), the
assistant message goes to the environment, its observation is appended. With
a PRM each step is judged from its observation. At the end the environment is
evaluated and ONE buffer item is written per trajectory:

    {"uid", "instance_id": task_id, "task_type", "reward": final, "raw_reward": final,
     "messages": the whole conversation, "tools",
     "steps": [{"step", "prompt_messages" (how many of `messages` were its prompt), "prompt_ids", "response_ids", "response_logprobs", "policy_version",
                "finish_reason", "prm_score", "prm_votes", "step_reward", "info"}],
     "prompt_ids", "response_ids", "response_logprobs", "policy_version",   # the last step's (one-sample readers)
     "extra_info": {"outcome", "success", "end_reason", "n_steps", "n_tool_calls", "well_formed_calls",
                    "details", "env": {track, task_id, sandbox level and limits}, "prm", "token_exact", ...}}

final = outcome + prm_step_coef · mean(step PRM) (outcome alone without a PRM);
step_reward = outcome + prm_step_coef · PRM of that step, which the trainer's
`--advantage-estimator step_wise` normalises per (task, step index).
A track's generator may set `shaping`, a callable
`(outcome, evaluation details, [step info]) -> (reward, [step reward], what it used)`
(the toolcall track's `RewardShaping`): its reward and step rewards then stand
where the outcome stood above, and `extra_info.shaping` records what it used.

`agent` picks who acts (a list is cycled over each task's group, e.g.
`["model", "oracle"]` puts a reference solution beside the policy's tries): `model` (the policy, through the gateway), `oracle`
(the task's reference solution, replayed through the gateway so its steps are
tokenized exactly as the server renders them; there are no sampling logprobs
for text the policy did not sample, so they are recorded as 0.0 = "none" and
`extra_info.behaviour` says `oracle`), or `noop` (one message, no action).

Every episode ends in bounded time: `max_steps`, the sandbox's command limits,
and any failure (gateway down, environment crash) ends it with the reason in
`extra_info.end_reason`; a trajectory whose environment failed is not written
(its reward would be made up) but counted.
"""

from __future__ import annotations

import base64
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from clawloop.envs.base import NOOP_MESSAGE, EnvOptions, tool_calls_of
from clawloop.envs.pool import PoolError, connect_pool
from clawloop.envs.prm import StepPRM
from clawloop.generation.client import GatewayClient

ENV_OPTION_KEYS = ("max_steps", "sandbox", "allow_unsandboxed", "command_timeout_s", "memory_mb", "disk_mb",
                   "task_dir", "tools_config", "work_dir", "keep_workspaces", "screenshot_backend", "gui_observation")


def _log(track: str, msg: str) -> None:
    print(f"[{track} generator] {msg}", file=sys.stderr, flush=True)


def env_options(data: dict[str, Any]) -> EnvOptions:
    """EnvOptions from a /start_rollout payload (the reference's names: max_steps, task_dir, ...)."""
    d = {k: data[k] for k in ENV_OPTION_KEYS if data.get(k) not in (None, "")}
    if "swe_bench_path" in data and "task_dir" not in d and data["swe_bench_path"]:
        d["task_dir"] = data["swe_bench_path"]
    for k in ("max_steps", "memory_mb", "disk_mb"):
        if k in d:
            d[k] = int(d[k])
    if "command_timeout_s" in d:
        d["command_timeout_s"] = float(d["command_timeout_s"])
    for k in ("allow_unsandboxed", "keep_workspaces"):
        if k in d and isinstance(d[k], str):
            d[k] = d[k].lower() in ("1", "true", "yes")
    return EnvOptions(**d)


class AgentRollout(GatewayClient):
    """One run of an agent generator, on the generators' HTTP client (retries, counters, policy versions)."""

    def __init__(self, track: str, data: dict[str, Any]):
        super().__init__(data, task_type=track)
        self.track = track
        self.opts = env_options(data)
        # slime's num_process when the payload gives it, else PARALLEL_ENVS
        self.num_process = max(1, int(data["num_process"] if "num_process" in data else data.get("parallel_envs", 4)))
        agents = data.get("agent") or "model"
        self.agents = [str(a) for a in (agents.split(",") if isinstance(agents, str) else agents)]
        bad = [a for a in self.agents if a not in ("model", "oracle", "noop")]
        if bad or not self.agents:
            raise ValueError(f"agent must be model, oracle or noop (or a list of them), got {agents!r}")
        self.pool = connect_pool(data.get("env_pool_url") or None, track, self.opts, capacity=self.num_process)
        self.prm = StepPRM.from_data(data, self.engine_url, track)
        self.shaping: Any = None  # (outcome, details, step infos) -> (reward, step rewards, info); None: outcome
        self.lease_wait_s = float(data.get("lease_wait_s", 600))
        self.tool_choice = data.get("tool_choice") or None
        """The policy's `tool_choice` on every step (None: the server's default, auto)."""
        self.artifact_dir = Path(data.get("artifact_dir") or Path(tempfile.gettempdir()) / f"clawloop-{track}-artifacts")
        self.images_dir = Path(data.get("images_dir") or self.artifact_dir / "images")
        """Where the item's image parts' bytes go, named by sha256 as the gateway's capture names them."""

    # -- tasks --------------------------------------------------------------------
    def task_ids(self) -> list[str]:
        ids = self.pool.task_ids()
        wanted = self.data.get("task_ids")
        if wanted:
            wanted = [str(x) for x in (wanted.split(",") if isinstance(wanted, str) else wanted)]
            missing = [t for t in wanted if t not in set(ids)]
            if missing:
                raise ValueError(f"task_ids: no such task(s) in track {self.track!r}: {', '.join(missing[:5])}")
            ids = wanted
        skip = {str(x) for x in self.data.get("skip_instance_ids") or []}
        ids = [t for t in ids if t not in skip]
        n = int(self.data.get("num_tasks") or 0)
        if n > 0:
            offset = int(self.data.get("task_offset") or 0) % max(1, len(ids))
            ids = (ids[offset:] + ids[:offset])[:n]
        return ids

    # -- one step through the gateway ----------------------------------------------
    def _chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                                "stream": False, "return_token_ids": True, **self.sampling}
        if tools:
            body["tools"] = tools
            if self.tool_choice:  # e.g. "required": every step is a (grammar-constrained) call
                body["tool_choice"] = self.tool_choice
        r = self._post(self.engine_url + "/chat/completions", body, self.headers)
        if r is None:
            return None
        reply = r.json()
        v = reply.get("policy_version")
        if v is None and r.headers.get("x-policy-version", "").isdigit():
            v = int(r.headers["x-policy-version"])
        self._see_version(v)
        choice = reply["choices"][0]
        msg = choice.get("message") or {}
        assistant: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            assistant["tool_calls"] = msg["tool_calls"]
        ids, lps = choice.get("token_ids"), choice.get("token_logprobs")
        exact = reply.get("prompt_token_ids") is not None and ids is not None and lps is not None \
            and len(ids) == len(lps)
        return {"assistant": assistant, "prompt_ids": reply.get("prompt_token_ids"), "response_ids": ids,
                "response_logprobs": [float(x) for x in lps] if lps is not None else None, "policy_version": v,
                "finish_reason": choice.get("finish_reason"), "token_exact": exact}

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                assistant: dict[str, Any]) -> dict[str, Any] | None:
        """Token ids of a message the policy did not sample (oracle/noop), as the server renders it:
        the prompt with the generation prompt, and the conversation with the message appended."""
        def ids_of(body_extra: dict[str, Any], msgs: list[dict[str, Any]]) -> tuple[list[int] | None, Any]:
            body: dict[str, Any] = {"model": self.model, "messages": msgs, "max_tokens": 1, "stream": False,
                                    "return_token_ids": True, "temperature": 0, **body_extra}
            if tools:
                body["tools"] = tools
            r = self._post(self.engine_url + "/chat/completions", body, self.headers)
            if r is None:
                return None, None
            reply = r.json()
            self._see_version(reply.get("policy_version"))
            return reply.get("prompt_token_ids"), reply.get("policy_version")

        prompt, v = ids_of({}, messages)
        full, _ = ids_of({"add_generation_prompt": False}, messages + [assistant])
        exact = prompt is not None and full is not None and full[:len(prompt)] == prompt and len(full) > len(prompt)
        resp = full[len(prompt):] if exact else None
        return {"assistant": assistant, "prompt_ids": prompt, "response_ids": resp,
                "response_logprobs": [0.0] * len(resp) if resp is not None else None, "policy_version": v,
                "finish_reason": "stop", "token_exact": exact}

    # -- one trajectory -------------------------------------------------------------
    def _lease(self, task_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.lease_wait_s
        delay = 0.2
        while True:
            try:
                return self.pool.allocate(task_id)
            except PoolError as e:
                if e.status != 429 or time.monotonic() > deadline:
                    raise
                self._count("pool_full_waits")
                time.sleep(delay)
                delay = min(2.0, delay * 1.5)

    def run_episode(self, task_id: str, agent: str = "model") -> dict[str, Any] | None:
        try:
            lease = self._lease(task_id)
        except PoolError as e:
            _log(self.track, f"task {task_id}: no environment: {e.message}")
            self._count("env_failed")
            return None
        lid = lease["lease_id"]
        try:
            return self._episode(task_id, lid, agent)
        except PoolError as e:
            _log(self.track, f"task {task_id}: environment failed: {e.message}")
            self._count("env_failed")
            return None
        finally:
            try:
                self.pool.close(lid)
            except PoolError:
                pass

    def _save_screenshot(self, episode: str, name: str, b64: str | None) -> str | None:
        """Write one observation's PNG beside the item (`artifact_dir/<episode>/<name>.png`); its path."""
        if not b64:
            return None
        folder = self.artifact_dir / episode
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(base64.b64decode(b64))
        os.replace(tmp, path)
        return str(path)

    def _episode(self, task_id: str, lid: str, agent: str) -> dict[str, Any] | None:
        first = self.pool.reset(lid)
        episode = str(uuid.uuid4())
        messages: list[dict[str, Any]] = list(first["messages"])
        first_shot = self._save_screenshot(episode, "step-00-reset", (first.get("info") or {}).pop(
            "screenshot_png_b64", None))
        tools = first.get("tools")
        script: list[dict[str, Any]] = []
        if agent == "oracle":
            script = list(self.pool.oracle(lid)["messages"])
        elif agent == "noop":
            script = [dict(NOOP_MESSAGE)]
        steps: list[dict[str, Any]] = []
        end_reason = "max_steps"
        n_calls = well_formed = 0
        t0 = time.monotonic()
        for t in range(self.opts.max_steps):
            t_model = time.monotonic()
            if agent == "model":
                out = self._chat(messages, tools)
            else:
                if t >= len(script):
                    end_reason = "script_ended"
                    break
                out = self._render(messages, tools, script[t])
            if out is None:
                end_reason = "gateway_failed"
                break
            model_ms = round(1000 * (time.monotonic() - t_model), 1)  # the gateway call (oracle: a render)
            assistant = out.pop("assistant")
            calls = tool_calls_of(assistant)
            n_calls += len(calls)
            well_formed += sum(1 for c in calls if c["arguments"] is not None)
            t_env = time.monotonic()
            res = self.pool.step(lid, assistant)
            env_ms = round(1000 * (time.monotonic() - t_env), 1)
            info = res.get("info") or {}
            shot = self._save_screenshot(episode, f"step-{t + 1:02d}", info.pop("screenshot_png_b64", None))
            step = {"step": t, "prompt_messages": len(messages), **out, "info": info, "model_ms": model_ms,
                    "env_ms": env_ms}
            if shot:
                step["screenshot"] = shot  # what the agent saw after this step
            if self.prm is not None:
                j = self.prm.score(messages, assistant, res["messages"], step["info"])
                step["prm_score"], step["prm_votes"] = j["score"], j["votes"]
                if j.get("error"):
                    step["prm_error"] = j["error"]
            steps.append(step)
            messages = messages + [assistant] + list(res["messages"])
            if res["done"]:
                end_reason = (res.get("info") or {}).get("end_reason") or "done"
                break
        if not steps:
            self._count("empty_trajectories")
            _log(self.track, f"task {task_id}: no step was taken ({end_reason})")
            return None
        ev = self.pool.evaluate(lid)
        describe = first.get("describe") or {}
        item = self._item(task_id, agent, messages, tools, steps, ev, end_reason, n_calls, well_formed, describe,
                          time.monotonic() - t0)
        if first_shot or any(s.get("screenshot") for s in steps):
            item["uid"] = episode
            item["extra_info"]["screenshots"] = {"dir": str(self.artifact_dir / episode), "reset": first_shot,
                                                 "steps": [s.get("screenshot") for s in steps]}
            item["messages"] = [_strip_images(m, self.images_dir) for m in item["messages"]]
        return item

    def _item(self, task_id: str, agent: str, messages: list[dict[str, Any]], tools: Any, steps: list[dict[str, Any]],
              ev: dict[str, Any], end_reason: str, n_calls: int, well_formed: int, describe: dict[str, Any],
              seconds: float) -> dict[str, Any]:
        outcome = float(ev["reward"])
        reward, step_rewards, shaping = outcome, [outcome] * len(steps), None
        if self.shaping is not None:
            reward, step_rewards, shaping = self.shaping(outcome, ev.get("details") or {}, [s["info"] for s in steps])
        coef = self.prm.coef if self.prm is not None else 0.0
        scored = [s["prm_score"] for s in steps if s.get("prm_score") is not None]
        for s, r in zip(steps, step_rewards):
            s["step_reward"] = r + coef * float(s.get("prm_score") or 0.0)
        final = reward + (coef * sum(scored) / len(scored) if scored else 0.0)
        exact = all(s.get("token_exact") for s in steps)
        versions = [s["policy_version"] for s in steps if s.get("policy_version") is not None]
        last = steps[-1]
        item: dict[str, Any] = {
            "uid": str(uuid.uuid4()), "instance_id": task_id, "task_type": self.task_type,
            "reward": final, "raw_reward": final, "messages": messages, "tools": tools, "steps": steps,
            "extra_info": {
                "outcome": outcome, "shaping": shaping, "success": bool(ev.get("success")), "end_reason": end_reason,
                "n_steps": len(steps), "n_tool_calls": n_calls, "well_formed_calls": well_formed,
                "details": ev.get("details") or {}, "env": describe, "behaviour": agent,
                "prm": None if self.prm is None else {"kind": self.prm.kind, "judge": self.prm.name,
                                                      "votes": self.prm.votes, "step_coef": coef,
                                                      "mean": sum(scored) / len(scored) if scored else None},
                "token_exact": exact, "policy_versions": versions, "seconds": round(seconds, 2),
                "max_steps": self.opts.max_steps, "max_tokens": self.max_tokens, **self.sampling,
            },
        }
        if last.get("token_exact"):
            item.update(prompt_ids=last["prompt_ids"], response_ids=last["response_ids"],
                        response_logprobs=last["response_logprobs"])
        item["policy_version"] = min(versions) if versions else 0
        return item

    # -- the run --------------------------------------------------------------------
    def rollout_one(self, task_id: str, agent: str = "model") -> None:  # type: ignore[override]
        item = self.run_episode(task_id, agent)
        if item is None:
            self._count("failed_samples")
            return
        self._count("episodes")
        self._count("success" if item["extra_info"]["success"] else "failure")
        self.send(item)

    def run(self) -> dict[str, Any]:  # type: ignore[override]
        ids = self.task_ids()
        jobs = [(tid, self.agents[k % len(self.agents)]) for _ in range(self.num_epoch) for tid in ids
                for k in range(self.group_size)]
        _log(self.track, f"{len(ids)} task(s) x {self.group_size} x {self.num_epoch} epoch(s) = {len(jobs)} "
                         f"episode(s), {self.num_process} at once, agent={','.join(self.agents)}, "
                         f"prm={self.prm.kind if self.prm else 'none'}")
        ex = ThreadPoolExecutor(self.num_process, thread_name_prefix=f"{self.track}-rollout")
        try:
            futures = [ex.submit(self.rollout_one, tid, agent) for tid, agent in jobs]
            for f in futures:
                if f.exception() is not None:  # a bug, not an env failure: count it, keep going
                    self._count("errors")
                    _log(self.track, f"episode failed: {f.exception()!r}")
            ex.shutdown(wait=True)
        except BaseException:
            # stopped (SIGTERM from `/stop_rollout` exits here): drop the queued episodes and close the
            # environments now, before the runner's grace runs out and kills the group; episodes still
            # running lose their environment (their workspaces go with it), not the machine
            ex.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            if self.prm is not None:
                self.prm.close()
            self.pool.shutdown()
            self.client.close()
        _log(self.track, f"done: {dict(self.counts)}")
        return dict(self.counts)


def _strip_images(message: dict[str, Any], images_dir: Path) -> dict[str, Any]:
    """The message with each image part's data URL replaced by the gateway's reference to it,
    `clawloop-image://<sha256>.<ext>`, its bytes written once to `images_dir/<sha256>.<ext>` (what the gateway's
    capture does): the trainer rebuilds a step's pixel inputs from those files. A data URL that does not parse
    becomes a short marker (no trainer can use it; the step's sample is then skipped, named). Text parts kept."""
    from clawloop.gateway.protocol import APIError, parse_image_part

    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for p in content:
        if isinstance(p, dict) and p.get("type") == "image_url":
            url = str((p.get("image_url") or {}).get("url", ""))
            if url.startswith("data:"):
                try:
                    im = parse_image_part(p, "messages")
                except APIError:
                    url = f"(an image, {len(url)} chars, that did not parse)"
                else:
                    _save_image(images_dir, im.filename, im.data)
                    url = im.ref
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append(p)
    return {**message, "content": parts}


def _save_image(folder: Path, name: str, data: bytes) -> None:
    """`folder/name` holding `data`, written once (content-addressed), atomically."""
    path = folder / name
    if path.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)


def run_agent_rollout(track: str, data: dict[str, Any]) -> dict[str, Any]:
    return AgentRollout(track, data).run()

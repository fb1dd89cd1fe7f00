"""The GUI env: one MiniWoB++ episode in a page of a pooled browser, observed as an element list (and a screenshot).

The script the env puts into every page is `page.js`, shipped beside this module
(package data) and read once at import: it collects the visible elements, gives
each a `data-cl-ref`, starts the episode the way miniwob's own environment does,
acts (clicks at an uncovered point, typing, selecting) and waits for the page to
settle. See the package's docstring for the observation, the actions and the reward.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import time
from importlib import resources
from typing import Any, Callable

from clawloop.envs.base import (Env, EnvOptions, Evaluation, Observation, StepResult, Task, assistant_tool_call,
                                tool_calls_of, tool_message)
from clawloop.envs.gui.actions import COMPUTER_TOOL, ActionError, keys_of, number_arg, ref_arg
from clawloop.envs.gui.browser import ACTION_TIMEOUT_S, Browser
from clawloop.envs.gui.chromium import TASK_AREA, VIEWPORT, GuiBrowserError
from clawloop.envs.gui.pool import browser_pool
from clawloop.envs.gui.solvers import SOLVED_TASKS, SOLVERS, solve

log = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 15
SETTLE_MAX_MS = 1500
EPISODE_TIME_MS = 86_400_000  # a day: MiniWoB's timer never ends an episode (setTimeout caps at 2**31-1 ms)
MAX_ELEMENTS = 200
MAX_TEXT = 120

DEFAULT_SYSTEM = (
    "You operate a small web page (160x210 pixels) in a browser to do the task you are given. Each observation "
    "lists the page's visible elements, one a line, as `[ref] kind \"text\"`, indented under their container; a "
    "ref stays the same for the whole task. Act with the `computer` tool: click an element, type into a field, "
    "press a key, select a dropdown option, scroll, or click at pixel coordinates of the screenshot. The task ends "
    "by itself when it is complete (usually when you press its submit button); call `done` if there is nothing "
    "left to do.")


def page_script() -> str:
    """The script the env installs in every page: `page.js` (package data), its episode time filled in."""
    text = resources.files(__package__).joinpath("page.js").read_text(encoding="utf-8")
    return text.replace("%(episode_ms)d", str(EPISODE_TIME_MS))


_PAGE_JS = page_script()


def effective_max_steps(opts: EnvOptions) -> int:
    """The track's own default (15) when the caller left the generic one (20)."""
    default = EnvOptions.__dataclass_fields__["max_steps"].default
    return DEFAULT_MAX_STEPS if opts.max_steps == default else max(1, opts.max_steps)


def _q(s: Any) -> str:
    return json.dumps(str(s), ensure_ascii=False)


def format_elements(elements: list[dict[str, Any]]) -> str:
    """The observation's element list, one `[ref] kind "text" ...` a line."""
    lines = []
    for e in elements[:MAX_ELEMENTS]:
        role = e.get("role", e["tag"])
        text = e.get("text", "")
        if len(text) > MAX_TEXT:
            text = text[: MAX_TEXT - 1] + "\u2026"
        if role == "input":
            parts = [f"input {e.get('type', 'text')}"] + ([_q(e["label"])] if e.get("label") else [])
            parts.append(f"value={_q(e.get('value', ''))}")
        elif role in ("checkbox", "radio"):
            parts = [role, _q(e.get("label", "")), f"checked={'true' if e.get('checked') else 'false'}"]
        elif role == "select":
            parts = ["select"] + ([_q(e["label"])] if e.get("label") else []) + [f"value={_q(e.get('value', ''))}"]
        elif role == "textarea":
            parts = ["textarea"] + ([_q(e["label"])] if e.get("label") else []) + [f"value={_q(e.get('value', ''))}"]
        elif role == "option":
            parts = ["option", _q(text)] + (["selected"] if e.get("selected") else [])
        elif role == "button":
            name = text or (e.get("attrs") or {}).get("value") or (e.get("attrs") or {}).get("title") or ""
            parts = ["button", _q(name)]
        elif role.startswith("svg "):
            attrs = e.get("attrs") or {}
            parts = [role] + ([_q(text)] if text else []) + [f"{k}={attrs[k]}" for k in ("fill", "stroke")
                                                               if k in attrs]
        else:
            parts = [role] + ([_q(text)] if text else [])
        if e.get("focused"):
            parts.append("focused")
        if e.get("disabled"):
            parts.append("disabled")
        lines.append("  " * min(e.get("depth", 0), 8) + f"[{e['ref']}] " + " ".join(parts))
    if len(elements) > MAX_ELEMENTS:
        lines.append(f"[... {len(elements) - MAX_ELEMENTS} more elements not shown]")
    return "\n".join(lines) if lines else "(no visible elements)"


class GuiEnv(Env):
    track = "gui"

    def __init__(self, task: Task, opts: EnvOptions, *, slot: int = 0):
        super().__init__(task, opts, slot=slot)
        self.backend = opts.screenshot_backend
        self.observe = opts.gui_observation
        self.max_steps = effective_max_steps(opts)
        self.action_timeout_s = max(5.0, min(ACTION_TIMEOUT_S, opts.command_timeout_s))
        self.browser: Browser | None = None
        self.page: Any = None
        self.last_screenshot: bytes | None = None
        self.closed = False
        self._reset_state()

    def _reset_state(self) -> None:
        self.steps = 0
        self.n_actions = 0
        self.n_errors = 0
        self.final: dict[str, Any] | None = None  # the page's status once the task ended
        self.end_reason: str | None = None
        self.step_ms: list[float] = []

    # -- browser plumbing ------------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable, *args, timeout: float | None = None) -> Any:
        if self.browser is None or self.page is None:
            raise GuiBrowserError("the episode has no page (reset() first, or the browser was lost)")
        return self.browser.call(what, fn, self.page, *args, timeout=timeout)

    def _js(self, what: str, fn: str, arg: Any = None, timeout: float | None = None) -> Any:
        return self._call(what, self.browser.backend.eval, fn, arg, timeout=timeout)

    def _release(self) -> None:
        b, page = self.browser, self.page
        self.browser, self.page = None, None
        if b is None:
            return
        try:
            if page is not None and not b.dead:
                b.call("close page", b.backend.close_page, page, timeout=10)
        except Exception as e:  # noqa: BLE001 - the page goes with the browser if it is broken
            log.debug("gui: closing a page: %s", e)
        finally:
            browser_pool(self.backend).release(b)

    def _open(self) -> None:
        self._release()
        pool = browser_pool(self.backend)
        for attempt in (1, 2):  # a browser that died since its last episode is replaced once, transparently
            self.browser = pool.acquire(self.action_timeout_s)
            try:
                self.page = self.browser.call("new page", self.browser.backend.new_page)
                break
            except Exception as e:
                self._release()
                if attempt == 2 or not isinstance(e, GuiBrowserError):
                    raise
        try:
            b = self.browser.backend
            self.browser.call("open task", b.goto, self.page, self.task.data["url"], timeout=self.action_timeout_s)
            ok = self._js("install", "() => " + _PAGE_JS)
            if not ok or not self._js("check", "() => typeof core !== 'undefined' && !!core.cover_div"):
                raise GuiBrowserError(f"{self.task.task_id}: the MiniWoB page did not load ({self.task.data['url']})")
            self._js("start", "(a) => __cl.start(a[0], a[1])", [self.task.data["seed"], "train"])
            deadline = time.monotonic() + 5
            while not self._js("ready", "() => __cl.ready()"):
                if time.monotonic() > deadline:
                    raise GuiBrowserError(f"{self.task.task_id}: the task did not become ready in 5 s")
                time.sleep(0.05)
            self._js("settle", "(ms) => __cl.settle(ms)", SETTLE_MAX_MS)
        except Exception:
            self._release()
            raise

    def _observe(self) -> tuple[str, dict[str, Any]]:
        """(the observation text, the page state) and a fresh screenshot."""
        state = self._js("observe", "() => __cl.collect(false)")
        self.last_screenshot = self._call("screenshot", self.browser.backend.screenshot)
        text = f"Task: {state['utterance']}"
        if self.observe != "screenshot":
            text += "\nElements:\n" + format_elements(state["elements"])
        return text, state

    def _content(self, text: str) -> str | list[dict[str, Any]]:
        if self.observe == "dom" or self.last_screenshot is None:
            return text
        return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": self._data_url()}}]

    def _data_url(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.last_screenshot or b"").decode()

    # -- the protocol ------------------------------------------------------------------------------------------
    def reset(self) -> Observation:
        if self.closed:
            raise GuiBrowserError("reset() after close()")
        t0 = time.monotonic()
        self._reset_state()
        self._open()
        text, _ = self._observe()
        msgs = [{"role": "system", "content": DEFAULT_SYSTEM}, {"role": "user", "content": self._content(text)}]
        obs = Observation(messages=msgs, tools=[COMPUTER_TOOL])
        info: dict[str, Any] = {"reset_ms": round(1000 * (time.monotonic() - t0), 1)}
        if self.last_screenshot is not None:  # every observation's PNG, for the rollout to save beside the item
            info["screenshot_png_b64"] = base64.b64encode(self.last_screenshot).decode()
        obs.info = info
        return obs

    def step(self, message: dict[str, Any]) -> StepResult:
        t0 = time.monotonic()
        self.steps += 1
        if self.final is not None or self.end_reason is not None:
            return StepResult(messages=[tool_message(c["id"], "error: the episode is over")
                                        for c in tool_calls_of(message)], done=True,
                              info={"end_reason": self.end_reason or "task_done"})
        calls = tool_calls_of(message)
        if not calls:
            self.end_reason = "no_action"
            info0: dict[str, Any] = {"end_reason": "no_action"}
            if self.last_screenshot is not None:  # nothing changed: the page as it stands
                info0["screenshot_png_b64"] = base64.b64encode(self.last_screenshot).decode()
            return StepResult(messages=[], done=True, info=info0)
        outs: list[str] = []
        infos: list[dict[str, Any]] = []
        for c in calls:
            if self.final is not None or self.end_reason is not None:
                outs.append("skipped: the episode is over")
                infos.append({"action": None, "skipped": True})
                continue
            self.n_actions += 1
            try:
                if c["name"] != "computer":
                    raise ActionError(f"no tool named {c['name']!r}; the tool is `computer`")
                if c["arguments"] is None:
                    raise ActionError(f"arguments are not a JSON object: {c['raw'][:200]}")
                text, info = self._act(c["arguments"])
            except ActionError as e:
                self.n_errors += 1
                text, info = f"error: {e}", {"error": str(e)}
            outs.append(text)
            infos.append({"action": (c["arguments"] or {}).get("action"), **info})
        done = self.final is not None or self.end_reason is not None
        if not done and self.steps >= self.max_steps:
            self.end_reason = "max_steps"
            done = True
        info: dict[str, Any] = {"calls": infos}
        if done:
            if self.final is not None:
                outs[-1] += "\nThe task is over."
                info["end_reason"] = "task_done"
            else:
                outs[-1] += "\nThe episode is over" + (" (step limit reached)." if self.end_reason == "max_steps"
                                                      else ".")
                info["end_reason"] = self.end_reason
            self._screenshot_quietly()
            content_last: str | list[dict[str, Any]] = outs[-1]
        else:
            obs, _ = self._observe()
            content_last = self._content(outs[-1] + "\n\n" + obs)
        msgs = [tool_message(c["id"], o) for c, o in zip(calls[:-1], outs[:-1])]
        last = tool_message(calls[-1]["id"], "")
        last["content"] = content_last
        msgs.append(last)
        if self.last_screenshot is not None:
            info["screenshot_png_b64"] = base64.b64encode(self.last_screenshot).decode()
        ms = 1000 * (time.monotonic() - t0)
        self.step_ms.append(ms)
        info["browser_ms"] = round(ms, 1)
        return StepResult(messages=msgs, done=done, info=info)

    def _screenshot_quietly(self) -> None:
        try:
            self.last_screenshot = self._call("screenshot", self.browser.backend.screenshot)
        except GuiBrowserError:
            raise
        except Exception as e:  # noqa: BLE001 - the episode is over; its last picture is optional
            log.debug("gui: last screenshot: %s", e)

    def _page_error(self, e: Exception) -> ActionError:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = re.sub(r"^(Page\.evaluate|Error|JavascriptException|Message):\s*", "", msg)
        msg = re.sub(r"^(Error|Uncaught Error|javascript error):\s*", "", msg)
        return ActionError(msg[:300])

    def _after(self) -> dict[str, Any]:
        """Wait for the page to settle after an action; note when the task has ended."""
        settle = "(ms) => window.__cl ? __cl.settle(ms) : null"
        try:
            st = self._js("settle", settle, SETTLE_MAX_MS, timeout=self.action_timeout_s)
        except GuiBrowserError:
            raise
        except Exception:  # noqa: BLE001 - the page is navigating: look again once it has
            time.sleep(0.3)
            st = self._js("settle", settle, SETTLE_MAX_MS, timeout=self.action_timeout_s)
        if st is None:  # a link took the browser away from the task's page: the task cannot end any more
            self.end_reason = "left_the_task_page"
            return {}
        if st.get("done"):
            self.final = st
        return st

    def _act(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        action = args.get("action")
        b = self.browser.backend
        try:
            if action == "done":
                self.end_reason = "agent_done"
                return "ok: done", {}
            if action == "click":
                ref = ref_arg(args)
                tgt = self._js("click", "(r) => __cl.target(r)", ref)
                if tgt.get("option"):
                    res = self._js("select", "(a) => __cl.select(a[0], a[1])", [ref, None])
                    self._after()
                    return f"ok: selected {_q(res['option'])} in {res['what']}", {"ref": ref}
                self._call("click", b.click, tgt["x"], tgt["y"])
                self._after()
                note = f" (it is covered by {tgt['covered']}; the click went there)" if tgt.get("covered") else ""
                return f"ok: clicked {tgt['what']}{note}", {"ref": ref, "x": round(tgt["x"]), "y": round(tgt["y"])}
            if action == "type":
                ref = ref_arg(args)
                text = args.get("text")
                if not isinstance(text, str):
                    raise ActionError("`text` (a string) is required for type")
                if len(text) > 500:
                    raise ActionError("`text` is longer than 500 characters")
                res = self._js("type", "(a) => __cl.focusField(a[0], a[1])", [ref, text])
                if not res.get("set"):
                    self._call("type", b.type_text, text)
                self._after()
                return f"ok: typed {_q(text)} into {res['what']}", {"ref": ref}
            if action == "press":
                key = args.get("key")
                if not isinstance(key, str):
                    raise ActionError("`key` (a string such as Enter) is required for press")
                keys = keys_of(key)
                self._call("press", b.press, keys)
                self._after()
                return f"ok: pressed {'+'.join(keys)}", {"key": "+".join(keys)}
            if action == "scroll":
                dx, dy = number_arg(args, "dx", required=False), number_arg(args, "dy", required=False)
                if dx == 0 and dy == 0:
                    raise ActionError("scroll needs `dx` and/or `dy` (pixels; positive dy scrolls down)")
                ref = ref_arg(args, required=False)
                if ref is not None:
                    p = self._js("scroll", "(r) => __cl.point(r)", ref)
                    x, y = p["x"], p["y"]
                else:
                    x, y = TASK_AREA[0] / 2, TASK_AREA[1] / 2
                self._call("scroll", b.wheel, x, y, max(-5000, min(5000, dx)), max(-5000, min(5000, dy)))
                self._after()
                return f"ok: scrolled by ({dx:g}, {dy:g})", {"ref": ref}
            if action == "click_xy":
                x, y = number_arg(args, "x"), number_arg(args, "y")
                if not (0 <= x < VIEWPORT[0] and 0 <= y < VIEWPORT[1]):
                    raise ActionError(f"x, y must be inside the page (0 <= x < {VIEWPORT[0]}, 0 <= y < "
                                       f"{VIEWPORT[1]}); the task area is {TASK_AREA[0]}x{TASK_AREA[1]}")
                self._call("click_xy", b.click, x, y)
                self._after()
                return f"ok: clicked at ({x:g}, {y:g})", {"x": x, "y": y}
            if action == "select":
                ref = ref_arg(args)
                option = args.get("option", args.get("text"))
                if not isinstance(option, str):
                    raise ActionError("`option` (the option's text) is required for select")
                res = self._js("select", "(a) => __cl.select(a[0], a[1])", [ref, option])
                self._after()
                return f"ok: selected {_q(res['option'])} in {res['what']}", {"ref": ref}
            raise ActionError(f"unknown action {action!r}: one of click, type, press, scroll, click_xy, select, done")
        except (ActionError, GuiBrowserError):
            raise
        except Exception as e:  # noqa: BLE001 - a page-side error (bad ref, hidden element) goes to the agent
            if self.browser is None or self.browser.dead or not self.browser.chromium.alive():
                raise GuiBrowserError(f"the browser died during {action}: {type(e).__name__}: {e}") from e
            raise self._page_error(e) from None

    def evaluate(self) -> Evaluation:
        st = self.final
        if st is None and self.browser is not None and self.page is not None and not self.browser.dead:
            try:
                st = self._js("status", "() => window.__cl ? __cl.status() : null")
                if not st or not st.get("done"):
                    st = None
            except Exception:  # noqa: BLE001 - no page to ask: the task did not end
                st = None
        raw = float(st["raw_reward"]) if st else None
        ok = raw is not None and raw > 0
        details = {"raw_reward": raw, "reason": (st or {}).get("reason"), "task_done": st is not None,
                   "end_reason": "task_done" if st is not None else (self.end_reason or "not_finished"),
                   "steps": self.steps, "actions": self.n_actions, "action_errors": self.n_errors,
                   "seed": self.task.data.get("seed"), "backend": self.backend,
                   "mean_step_ms": round(sum(self.step_ms) / len(self.step_ms), 1) if self.step_ms else None}
        if not ok:
            details["reason"] = details["reason"] or ("the task ended with reward %g" % raw if st else
                                                      f"the task did not end ({details['end_reason']})")
        return Evaluation(reward=1.0 if ok else -1.0, success=ok, details=details)

    def page_state(self, extra: str | None = None) -> dict[str, Any]:
        """Everything the solvers read: utterance, every element (hidden ones too) and an optional page value."""
        state = self._js("state", "() => __cl.collect(true)")
        if extra:
            state["extra"] = self._js("state", "(e) => __cl.extra(e)", extra)
        state["task_id"] = self.task.task_id
        return state

    def oracle(self) -> list[dict[str, Any]]:
        if self.task.task_id not in SOLVERS:
            raise ValueError(f"gui task {self.task.task_id!r} has no scripted solution (solved tasks: "
                             f"{', '.join(SOLVED_TASKS)})")
        if self.page is None:
            raise GuiBrowserError("oracle() needs a reset() episode: it reads the page")
        actions = solve(self.task.task_id, self)
        per = max(1, math.ceil(len(actions) / max(1, self.max_steps)))
        msgs = []
        for i in range(0, len(actions), per):
            chunk = actions[i:i + per]
            m = assistant_tool_call("computer", chunk[0], call_id=f"call_{i}")
            for j, a in enumerate(chunk[1:], 1):
                m["tool_calls"].append({"id": f"call_{i + j}", "type": "function",
                                        "function": {"name": "computer", "arguments": json.dumps(a)}})
            msgs.append(m)
        return msgs

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._release()

    def describe(self) -> dict[str, Any]:
        d = {"track": self.track, "task_id": self.task.task_id, "backend": self.backend,
             "observation": self.observe, "max_steps": self.max_steps, "seed": self.task.data.get("seed")}
        if self.browser is not None:
            d["browser"] = {"index": self.browser.index, "pid": self.browser.chromium.pid,
                            "version": getattr(self.browser, "version", ""),
                            "sandboxed": self.browser.chromium.sandboxed}
        return d

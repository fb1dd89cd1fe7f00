"""Per-step process reward (PRM) for agent trajectories, through clawloop's judge.

    prm = StepPRM.from_data(data, engine_url)        # None when data["prm"] is "none"
    j = prm.score(history, assistant, observation)   # {"score": -1|0|1, "votes": [...], "judge": name}

An agent step is judged the way clawloop judges a served turn: the prompt it
saw, what it did, and the next state (the environment's observation), by the
same next-state prompt and majority vote (`clawloop.judge.llm.LLMJudge`), with:
- `url`: any OpenAI-compatible endpoint (`prm_url`, `prm_model`, `prm_api_key`);
- `self`: the served policy at the gateway the generator talks to;
- `frozen`: a frozen copy of the base model loaded in the generator process (`prm_model` or the tiny model);
- `offline`: rules on the observation, no LLM: an error (non-zero return code, a
  timeout, a traceback, a tool error, a format error) is -1, an action that ran
  cleanly +1, a final message with no observation 0.
`prm_votes` (m) calls per step; the terminal track judges only the most recent
step (the instruction, the action, its observation: one short prompt), as the
reference does; the others judge the step in its full history. A GUI step's
next state carries its screenshot (the observation's image parts): a judge
model that takes images sees it after the prompt's text (a Qwen-VL model on
the hf engine: `frozen` on such a folder, or `self` / `url` at a gateway that
serves one); a text judge reads the observation's text only.
"""

from __future__ import annotations

import asyncio
import re
import threading
from types import SimpleNamespace
from typing import Any

from clawloop.judge.base import text_of
from clawloop.judge.llm import EngineChatBackend, HTTPChatBackend, LLMJudge
from clawloop.judge.offline import find_error
from clawloop.naming import model_path
from clawloop.records import Turn

_RC = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
PRM_KINDS = ("none", "offline", "self", "url", "frozen")


def _obs_text(observation: list[dict[str, Any]]) -> str:
    return "\n".join(text_of(m.get("content")) for m in observation)


def offline_step_score(assistant: dict[str, Any], observation: list[dict[str, Any]], info: dict[str, Any]) -> int:
    """-1 for an observation that reports an error, +1 for one that ran cleanly, 0 without one."""
    if not observation:
        return 0

    text = _obs_text(observation)
    if info.get("error") or info.get("format_error") or info.get("timed_out"):
        return -1
    calls = info.get("calls") or []
    if any(c.get("error") or c.get("reason") or c.get("timed_out") or (c.get("returncode") not in (None, 0))
           for c in calls):
        return -1
    m = _RC.search(text)
    if m and int(m.group(1)) != 0:
        return -1
    if "format error" in text.lower() or text.lstrip().lower().startswith("error"):
        return -1
    return -1 if find_error(text) else 1


class StepPRM:
    def __init__(self, kind: str, *, track: str, votes: int = 1, coef: float = 1.0, judge: Any = None):
        self.kind = kind
        self.track = track
        self.votes = votes
        self.coef = coef
        self.judge = judge
        self.name = "offline-step" if kind == "offline" else getattr(judge, "name", kind)
        self._loop: asyncio.AbstractEventLoop | None = None
        if judge is not None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True, name="prm-loop").start()

    @classmethod
    def from_data(cls, data: dict[str, Any], engine_url: str, track: str) -> "StepPRM | None":
        kind = str(data.get("prm") or "none")
        if kind not in PRM_KINDS:
            raise ValueError(f"prm must be one of {', '.join(PRM_KINDS)}, got {kind!r}")
        if kind == "none":
            return None
        votes = int(data.get("prm_votes") or (1 if track == "terminal" else 3))
        coef = float(data.get("prm_step_coef", 1.0))
        if kind == "offline":
            return cls(kind, track=track, votes=1, coef=coef)

        timeout = float(data.get("prm_timeout_s", 120))
        if kind == "url":
            if not data.get("prm_url"):
                raise ValueError("prm_url: --prm url needs the judge endpoint (--prm-url)")
            backend: Any = HTTPChatBackend(str(data["prm_url"]), str(data.get("prm_model") or ""),
                                           str(data.get("prm_api_key") or ""), timeout)
            name = f"prm:url:{data.get('prm_model') or data['prm_url']}"
        elif kind == "self":
            key = data.get("api_key") or ""
            backend = HTTPChatBackend(engine_url, str(data.get("model") or ""), str(key), timeout)
            name = "prm:self"
        else:  # frozen
            # lazy: the frozen PRM's engine loads torch and transformers, which no other kind needs
            from clawloop.engines.hf import HFEngine

            path = model_path(SimpleNamespace(path=str(data.get("prm_model") or "")))  # else the tiny model
            backend = EngineChatBackend(HFEngine(path, device="cpu"), owns_engine=True)
            name = f"prm:frozen:{path}"
        judge = LLMJudge(backend, name=name, votes=votes, threshold=float(data.get("prm_threshold", 0.5)),
                         temperature=float(data.get("prm_temperature", 0.6)), hints=False,
                         max_tokens=int(data.get("prm_max_tokens", 1024)))
        return cls(kind, track=track, votes=votes, coef=coef, judge=judge)

    def score(self, history: list[dict[str, Any]], assistant: dict[str, Any], observation: list[dict[str, Any]],
              info: dict[str, Any]) -> dict[str, Any]:
        if self.judge is None:
            s = offline_step_score(assistant, observation, info)
            return {"score": s, "votes": [s], "judge": self.name}
        if self.track == "terminal":  # the most recent step only: instruction, action, observation
            history = [m for m in history if m.get("role") in ("system", "user")][:2]
        text = _obs_text(observation) or "(no observation: the episode ended)"
        shots = [p for m in observation if isinstance(m.get("content"), list) for p in m["content"]
                 if isinstance(p, dict) and p.get("type") == "image_url"]
        next_state = {"role": "user", "content": [{"type": "text", "text": text}, *shots] if shots else text}
        turn = Turn(session_id="prm", index=len(history), type="side", messages=history, tools=None,
                    prompt_ids=[], response_ids=[], response_logprobs=[], response_text=assistant.get("content") or "",
                    tool_calls=assistant.get("tool_calls"), policy_version=0, next_state=next_state)
        assert self._loop is not None
        try:
            j = asyncio.run_coroutine_threadsafe(self.judge.judge(turn), self._loop).result()
        except Exception as e:  # noqa: BLE001 - a PRM outage leaves the step unscored, never made up
            return {"score": None, "votes": [], "judge": self.name, "error": f"{type(e).__name__}: {e}"}
        return {"score": int(j.score), "votes": list(j.votes), "judge": self.name}

    def close(self) -> None:
        if self.judge is not None and self._loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(self.judge.close(), self._loop).result(timeout=10)
            except Exception:  # noqa: BLE001
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)

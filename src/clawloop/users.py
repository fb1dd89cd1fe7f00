"""Simulated users and raters, shared by `clawloop demo` and `clawloop eval`.

A *user* opens a conversation about a problem and answers each assistant
reply with a next message (thanks, or a correction) and whether it is
satisfied. A *rater* scores one answer against a persona's rubric in [0, 1].
Both come built in (rules, CPU only, for the tiny model's answer styles) or as
an LLM at any OpenAI-compatible URL:

    user = RuleUser("bare", Wording("heldout"))              # the demo's users
    user = LLMUser(persona, client, model)                   # a persona played by an LLM
    rater = RuleRater() | LLMRater(client, model, votes=3)
    stats = converse(client, user, rng, "sid-1", turns=4, problems=...)

Users and raters call their LLM as side turns (`X-Turn-Type: side`), so a
clawloop serving them never trains on the simulation itself; other endpoints
ignore the header. `Server` starts `clawloop up`/`serve` in a child process.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import httpx

from clawloop.tinymodel.corpus import STYLES, correction_for, extract_answer, fits_style, sample_question

THANKS = ("Thanks!", "Great, thank you.", "Perfect, thanks!", "Thank you!", "Nice, thanks.")
WORDINGS = ("corpus", "heldout")
HELDOUT_WORDING_FILE = "data/demo_wording_heldout.json"
SIDE = {"X-Turn-Type": "side"}


def heldout_wording() -> dict[str, Any]:
    """The held-out phrase set: {"thanks": [...], "corrections": {style: [...]}}, checked."""
    data = json.loads(resources.files("clawloop").joinpath(HELDOUT_WORDING_FILE).read_text(encoding="utf-8"))
    missing = [s for s in STYLES if not data.get("corrections", {}).get(s)]
    if not data.get("thanks") or missing:
        raise ValueError(f"{HELDOUT_WORDING_FILE}: needs 'thanks' and corrections for every style (missing: {missing})")
    return data


class Wording:
    """What simulated users say: a correction asking for a style, thanks before the next question."""

    def __init__(self, kind: str = "corpus"):
        if kind not in WORDINGS:
            raise ValueError(f"wording must be one of {WORDINGS}, got {kind!r}")
        self.kind = kind
        self._heldout = heldout_wording() if kind == "heldout" else None

    def correction(self, style: str, rng: random.Random) -> str:
        if self._heldout is None:
            return correction_for(style, rng)
        return rng.choice(self._heldout["corrections"][style])

    def thanks(self, rng: random.Random) -> str:
        return rng.choice(self._heldout["thanks"] if self._heldout is not None else THANKS)


# ---------------------------------------------------------------- personas


@dataclass(frozen=True)
class Persona:
    name: str
    who: str
    """The user's situation, in the second person (what an LLM user plays)."""
    wants: str
    """The hidden preference: never told to the assistant."""
    rubric: str
    """What the rater checks, for a 0-10 score."""
    style: str
    """The tiny model's answer style the built-in user and rater stand for (`corpus.STYLES`)."""


PERSONAS: dict[str, Persona] = {
    "student": Persona(
        "student",
        "You are a student doing maths homework with the help of an AI assistant.",
        "You want answers you can copy into your homework without them looking AI-written: just the result, no "
        "'The answer is', no explanation, no exclamation marks, no chatty phrases.",
        "10: the correct result, given bare, with nothing a teacher would recognise as AI-written. Take off 5 for "
        "a wrong or missing result and up to 5 for AI-looking form (full sentences, 'The answer is', "
        "explanations, exclamation marks, pleasantries).",
        "bare"),
    "teacher": Persona(
        "teacher",
        "You are a teacher grading homework; you ask an AI assistant for the result to put in your grading "
        "comment.",
        "You want a friendly, encouraging comment you can paste to the student: a full sentence that states the "
        "result and ends warmly with an exclamation mark.",
        "10: the correct result in a friendly, encouraging full sentence ending with an exclamation mark. Take "
        "off 5 for a wrong or missing result and up to 5 when it is bare, curt, shouted in capitals or not "
        "friendly.",
        "exclaim"),
}


def personas_from(names: str) -> list[Persona]:
    out = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name not in PERSONAS:
            raise ValueError(f"--personas: unknown persona {name!r}; built-in: {', '.join(PERSONAS)}")
        out.append(PERSONAS[name])
    if not out:
        raise ValueError("--personas: name at least one persona")
    return out


# ---------------------------------------------------------------- users


class User(Protocol):
    def opening(self, problem: dict[str, str], rng: random.Random) -> str: ...

    def reply(self, problem: dict[str, str], messages: list[dict[str, Any]], rng: random.Random
              ) -> tuple[str, bool]:
        """The user's next message after the last (assistant) message, and whether it satisfied them."""


WRONG = ("That's wrong.", "No, that's not right.", "That is incorrect, try again.")


class RuleUser:
    """The built-in user: satisfied when the answer is in `style`; else asks for it in `wording`. With
    `check_answer` it also wants the right result: a wrong one gets "That's wrong." (plus the style
    correction when the form misses too), which the offline judge reads as -1."""

    def __init__(self, style: str, wording: Wording | None = None, *, check_answer: bool = False):
        if style not in STYLES:
            raise ValueError(f"unknown style {style!r}; expected one of {STYLES}")
        self.style, self.wording, self.check_answer = style, wording or Wording(), check_answer

    def opening(self, problem: dict[str, str], rng: random.Random) -> str:
        return problem["question"]

    def reply(self, problem: dict[str, str], messages: list[dict[str, Any]], rng: random.Random
              ) -> tuple[str, bool]:
        answer = messages[-1].get("content") or ""
        fits = fits_style(answer, self.style)
        if self.check_answer and extract_answer(answer) != str(problem.get("answer", "")).strip().lower():
            return (rng.choice(WRONG) + ("" if fits else " " + self.wording.correction(self.style, rng))), False
        if fits:
            return self.wording.thanks(rng), True
        return self.wording.correction(self.style, rng), False


def first_model(client: Any) -> str:
    """The first model an OpenAI-compatible endpoint lists ("default" when it lists none)."""
    try:
        data = client.models.list().data
        return data[0].id if data else "default"
    except Exception:  # noqa: BLE001 - endpoints without /v1/models still chat
        return "default"


DONE_MARK = "[DONE]"


class LLMUser:
    """A persona played by an LLM: it writes the opening message and each reply, and says [DONE] when satisfied."""

    def __init__(self, persona: Persona, client: Any, model: str = "", max_tokens: int = 200):
        self.persona, self.client, self.max_tokens = persona, client, max_tokens
        self.model = model or first_model(client)
        self.calls = 0

    def _say(self, prompt: str, seed: int) -> str:
        self.calls += 1
        r = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "system", "content": self.persona.who},
                                        {"role": "user", "content": prompt}],
            max_tokens=self.max_tokens, temperature=0.7, seed=seed, extra_headers=SIDE)
        return (r.choices[0].message.content or "").strip()

    def opening(self, problem: dict[str, str], rng: random.Random) -> str:
        text = self._say(f"Write the message you send to the assistant to get help with this problem. Do not "
                         f"state your preferences about the form of the answer.\nProblem: {problem['question']}\n"
                         f"Write only the message.", rng.randrange(1 << 30))
        return text or problem["question"]

    def reply(self, problem: dict[str, str], messages: list[dict[str, Any]], rng: random.Random
              ) -> tuple[str, bool]:
        answer = messages[-1].get("content") or ""
        text = self._say(
            f"What you privately want (never say that you were told this): {self.persona.wants}\n"
            f"The problem: {problem['question']}\nThe assistant just answered:\n---\n{answer}\n---\n"
            f"Write your next message to the assistant, as this user would. If the answer gives you exactly what "
            f"you want, thank it briefly and end with {DONE_MARK}. Otherwise say what to change.",
            rng.randrange(1 << 30))
        satisfied = DONE_MARK in text
        text = text.replace(DONE_MARK, "").strip()
        return (text or ("Thanks." if satisfied else "That is not what I need.")), satisfied


def converse(client: Any, user: User, rng: random.Random, sid: str, turns: int, *,
             problems: list[dict[str, str]] | None = None, model: str = "clawloop", max_tokens: int = 24,
             per_problem: int = 0) -> dict[str, int]:
    """One session of `turns` assistant turns through the policy (main turns: they are captured and trained
    on). A satisfied user thanks and asks the next problem in the same message; an unsatisfied one corrects.
    `per_problem` > 0 moves on after that many tries at one problem. The last request says X-Session-Done."""
    stats = {"answers": 0, "fit": 0, "problems": 1}
    pick = (lambda: rng.choice(problems)) if problems else (lambda: sample_question(rng))
    problem = pick()
    msgs: list[dict[str, Any]] = [{"role": "user", "content": user.opening(problem, rng)}]
    tries = 0
    for k in range(turns):
        last = k == turns - 1
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=1.0,
                                           extra_headers={"X-Session-Id": sid, **({"X-Session-Done": "1"} if last
                                                                                   else {})})
        msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        stats["answers"] += 1
        tries += 1
        text, satisfied = user.reply(problem, msgs, rng)
        stats["fit"] += satisfied
        if last:
            break
        if satisfied or (per_problem and tries >= per_problem):
            problem, tries = pick(), 0
            stats["problems"] += 1
            text = f"{text} {user.opening(problem, rng)}"
        msgs.append({"role": "user", "content": text})
    return stats


def run_user(client: Any, preference: str, rng: random.Random, sid: str, turns: int,
             wording: Wording | None = None) -> dict[str, int]:
    """The demo's session: questions from the corpus, corrections towards `preference`, thanks when it fits.
    `fit` counts every answer that fit, the last one included."""
    return converse(client, RuleUser(preference, wording), rng, sid, turns)


# ---------------------------------------------------------------- raters


class Rater(Protocol):
    def score(self, persona: Persona, problem: dict[str, str], answer: str) -> float | None:
        """In [0, 1]; None when no valid score came back."""


class RuleRater:
    """The built-in rater: 0.5 for the right result, 0.5 for the persona's style (`corpus.fits_style`)."""

    def parts(self, persona: Persona, problem: dict[str, str], answer: str) -> dict[str, bool]:
        return {"correct": extract_answer(answer) == str(problem.get("answer", "")).strip().lower(),
                "form": fits_style(answer, persona.style)}

    def score(self, persona: Persona, problem: dict[str, str], answer: str) -> float | None:
        p = self.parts(persona, problem, answer)
        return 0.5 * p["correct"] + 0.5 * p["form"]


_SCORE = re.compile(r"score\s*[:=]?\s*(\d+(?:\.\d+)?)", re.I)


def parse_score(text: str) -> float | None:
    """0-10 from "Score: N" (else the last number in the text), as [0, 1]; None when absent or out of range."""
    m = _SCORE.search(text or "")
    raw = m.group(1) if m else (re.findall(r"\d+(?:\.\d+)?", text or "") or [None])[-1]
    if raw is None:
        return None
    v = float(raw)
    return v / 10 if 0 <= v <= 10 else None


class LLMRater:
    """An LLM scores 0-10 against the persona's rubric; the mean of `votes` valid scores (None if none)."""

    def __init__(self, client: Any, model: str = "", votes: int = 1, max_tokens: int = 64):
        self.client, self.votes, self.max_tokens = client, max(1, votes), max_tokens
        self.model = model or first_model(client)
        self.invalid = 0
        self.calls = 0

    def score(self, persona: Persona, problem: dict[str, str], answer: str) -> float | None:
        prompt = (f"You rate an AI assistant's answer for this user: {persona.who} {persona.wants}\n"
                  f"Rubric: {persona.rubric}\nProblem: {problem['question']}\n"
                  f"Correct result: {problem.get('answer', '?')}\nThe answer:\n---\n{answer}\n---\n"
                  f"Reply with one line: Score: N (an integer from 0 to 10).")
        got = []
        for v in range(self.votes):
            self.calls += 1
            r = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=self.max_tokens, temperature=0.0 if v == 0 else 0.7,
                                                    seed=v, extra_headers=SIDE)
            s = parse_score(r.choices[0].message.content or "")
            if s is None:
                self.invalid += 1
            else:
                got.append(s)
        return sum(got) / len(got) if got else None


# ---------------------------------------------------------------- a clawloop in a child process


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (Linux), so a killed
    eval or demo leaves no `clawloop up` behind; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


class Server:
    """`clawloop up|serve FLAGS` on a free loopback port in a child process; `stop()` sends SIGINT (graceful)."""

    def __init__(self, flags: list[str], data_dir: str, command: str = "up", timeout_s: float = 300):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "clawloop.cli", command, "--port", str(self.port), "--data-dir", data_dir,
               *flags]
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        self.log = open(Path(data_dir) / f"{command}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                     env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError(f"clawloop {command} exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"clawloop {command} did not start within {timeout_s:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def base_url(url: str) -> str:
    """`http://host:port` from a base URL given with or without `/v1`."""
    return url.rstrip("/").removesuffix("/v1")


def policy_version(url: str) -> int:
    return int(httpx.get(base_url(url) + "/health", timeout=10).json()["policy_version"])


def post_result(url: str, result: dict[str, Any], api_key: str = "") -> str | None:
    """POST a learning curve to a clawloop's `/api/results` (the dashboard shows it). Its id, or None with a
    warning on stderr when the server does not take it (not a clawloop, an old one, a bad key)."""
    key = api_key or os.environ.get("OPENCLAW_API_KEY", "")
    try:
        r = httpx.post(base_url(url) + "/api/results", json=result, timeout=30,
                       headers={"Authorization": f"Bearer {key}"} if key else {})
    except httpx.HTTPError as e:
        print(f"warning: could not post the result to {url}: {e}", file=sys.stderr)
        return None
    if not 200 <= r.status_code < 300:
        print(f"warning: {url}/api/results answered {r.status_code}: {r.text[:200]}", file=sys.stderr)
        return None
    return r.json().get("id")

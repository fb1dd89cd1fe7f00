"""Seconds from `make run` on a fresh clone to the first chat completion.

    .venv/bin/python bench/first_reply.py [--empty-cache]

Clones this repository into a temp folder, runs `make run` there in its own process group (it
creates `.venv` and installs everything), polls `POST /v1/chat/completions` ("What is 12+7?") with
the official openai client every second, prints the time and the answer, then stops exactly that
process group. `--empty-cache` points CLAWLOOP_CACHE at an empty folder, so the shipped model is
what serves.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--empty-cache", action="store_true")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="clawloop-first-reply-"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = dict(os.environ, OPENCLAW_PORT=str(a.port))
    if a.empty_cache:
        env["CLAWLOOP_CACHE"] = str(work / "cache")
    log = open(work / "make-run.log", "w")
    t0 = time.time()
    p = subprocess.Popen(["make", "run"], cwd=clone, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         env=env)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key="x", max_retries=0, timeout=5)
    answer = None
    try:
        while time.time() - t0 < a.timeout and p.poll() is None:
            try:
                r = client.chat.completions.create(model="clawloop",
                                                   messages=[{"role": "user", "content": "What is 12+7?"}])
                answer = r.choices[0].message.content
                break
            except openai.OpenAIError:
                time.sleep(1)
        print(f"first reply after {time.time() - t0:.1f} s: {answer!r} (log: {work / 'make-run.log'})")
    finally:
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(clone / ".venv", ignore_errors=True)
    return 0 if answer else 1


if __name__ == "__main__":
    sys.exit(main())

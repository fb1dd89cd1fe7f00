"""The GUI track: the MiniWoB++ pages of the `miniwob` package as tasks, each with a fixed seed.

`load_tasks` lists the pages with a scripted solution (`SOLVED_TASKS`, solved in
`solvers.py`); any other page (not the flight.* ones, which need a web server)
is reachable with `TRACK.get_task(name)`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from clawloop.envs.base import EnvOptions, Task, Track
from clawloop.envs.gui.chromium import BACKENDS
from clawloop.envs.gui.env import GuiEnv
from clawloop.envs.gui.solvers import SOLVED_TASKS, SOLVERS

OBSERVATIONS = ("dom", "screenshot", "both")


def miniwob_dir() -> Path:
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.origin:
        raise ValueError("the gui track needs the miniwob package: pip install -e '.[gui]'")
    return Path(spec.origin).parent / "html" / "miniwob"


def all_task_ids() -> list[str]:
    """Every MiniWoB++ page the package ships (not the flight.* tasks, which need a web server)."""
    return sorted(p.stem for p in miniwob_dir().glob("*.html"))


class GuiTrack(Track):
    name = "gui"

    def _task(self, task_id: str, html: Path) -> Task:
        return Task(task_id=task_id, track=self.name, instruction=f"MiniWoB++ task {task_id}",
                    data={"html": str(html), "url": html.resolve().as_uri(), "seed": f"clawloop-gui:{task_id}",
                          "solved": task_id in SOLVERS})

    def load_tasks(self, opts: EnvOptions) -> list[Task]:
        if opts.task_dir:
            raise ValueError("gui track: --task-dir is not supported (its tasks are the MiniWoB++ pages of the "
                             "miniwob package)")
        _check_options(opts)
        root = miniwob_dir()
        tasks = []
        for tid in SOLVED_TASKS:
            html = root / f"{tid}.html"
            if not html.is_file():
                raise ValueError(f"gui task {tid!r}: no page {html} (miniwob==1.1.0 expected)")
            tasks.append(self._task(tid, html))
        return tasks

    def get_task(self, task_id: str) -> Task:
        """Any MiniWoB++ page by name, solved or not (the oracle of an unsolved one raises)."""
        html = miniwob_dir() / f"{task_id}.html"
        if "/" in task_id or not html.is_file():
            raise ValueError(f"no MiniWoB++ task {task_id!r} (pages: {', '.join(all_task_ids())})")
        return self._task(task_id, html)

    def make_env(self, task: Task, opts: EnvOptions, *, slot: int = 0) -> "GuiEnv":
        _check_options(opts)
        return GuiEnv(task, opts, slot=slot)


def _check_options(opts: EnvOptions) -> None:
    if opts.screenshot_backend not in BACKENDS:
        raise ValueError(f"SCREENSHOT_BACKEND must be one of {', '.join(BACKENDS)}, not {opts.screenshot_backend!r}")
    if opts.gui_observation not in OBSERVATIONS:
        raise ValueError(f"gui_observation must be one of {', '.join(OBSERVATIONS)}, not {opts.gui_observation!r}")


TRACK = GuiTrack()

"""The GUI track: MiniWoB++ web tasks in a real (headless) chromium, acted on with one `computer` tool.

    ENV_TYPE=gui [SCREENSHOT_BACKEND=playwright|selenium] [gui_observation=dom|screenshot|both]
    clawloop env check --track gui [--tasks click-button,enter-text]

Tasks are the MiniWoB++ pages shipped in the `miniwob` package (1.1.0), loaded
from its `html/miniwob/` folder by file:// URL; nothing is fetched from the
network (chromium runs with every http(s)/ws host unreachable: a dead proxy and
a resolver that resolves nothing, and playwright also aborts any non-file
request). The task ids are the page names; `load_tasks` lists the ones with a
scripted solution (`SOLVED_TASKS`); any other MiniWoB page (not the flight.*
ones, which need a web server) is reachable with `TRACK.get_task(name)`, and its
`oracle()` raises saying there is no solver.

An episode starts the page the way miniwob's own environment does
(`Math.seedrandom(seed)`, `core.setDataMode("train")`, `core.startEpisodeReal()`,
then waiting for `WOB_TASK_READY`), with a fixed seed per task id
(`clawloop-gui:<task id>`), so the same task id is the same problem every time.
The page's time limit is lifted: `core.EPISODE_MAX_TIME` is set to a day before
the episode starts, so a slow model is judged on what it does, not on wall time;
`max_steps` bounds the episode instead (15 for this track when the caller left
the generic default of 20; any other value is used as given).

Observation: the task's utterance and a compact list of the page's visible
elements (the task area, and jQuery UI widgets such as dialogs and autocomplete
menus that the page appends to the body), one a line, indented under the element
that contains them:

    [3] button "Submit"
    [5] input text "Username" value=""
    [7] checkbox "ksa" checked=false
    [9] select value="Spain"
      [10] option "Spain" selected

A ref is a `data-cl-ref` attribute the env's script puts on each element the
first time it sees it, so an element keeps its ref for the whole episode. The
env also takes a PNG screenshot of the 160x210 task area after every step (its
pixels are CSS pixels, the coordinates `click_xy` takes): the latest is
`env.last_screenshot` (bytes), and with `gui_observation` `screenshot` or `both`
it also goes into the observation as an OpenAI `image_url` content part (a
`data:image/png;base64,...` URL, in the user message at reset and in the last
tool message of each step). Every observation's PNG, whatever the mode, is in
`info["screenshot_png_b64"]` (plain base64; the reset's in `Observation.info`),
which the rollout saves beside the item.
With `screenshot` the element list is left out of the text.

Actions: one tool, `computer`, with `action` one of `click` (ref: a real mouse
click at a point of the element that is not covered), `type` (ref, text: focus
the field, clear it, type the text key by key; date/time/color/range inputs get
their value set the way Playwright's `fill` does, accepting MM/DD/YYYY or
YYYY-MM-DD dates and 24 h or AM/PM times), `press` (key, e.g. Enter, Tab,
ArrowDown, Control+A), `scroll` (dx, dy, optionally at a ref), `click_xy`
(x, y), `select` (ref, option: choose a dropdown's option by its text), `done`.
One assistant message may make several calls; each gets a tool message, the last
one carrying the new observation. Bad arguments or a ref that is gone answer with
a readable error in the tool message. After every action the env waits (at most
1.5 s) until the page's short timers (setTimeout up to 3 s) and jQuery
animations are over, so autocomplete menus and accordions have opened before the
next action. The episode ends when the task reports done, on `done`, on a
message without a tool call, or at `max_steps`.

Reward: MiniWoB's own: +1 when the task ended with a raw reward > 0, else -1
(the raw reward, the page's reason and how the episode ended are in
`Evaluation.details`; a partially right click-checkboxes answer has 0 < raw < 1
and counts as a success, as MiniWoB counts it).

Browsers: chromium (/usr/bin/chromium, or $CLAWLOOP_CHROMIUM) is started by
this package itself (`chromium.py`), headless, in a session (process group) of its own with a
temporary profile, and driven through its DevTools port on 127.0.0.1:
`playwright` attaches with `connect_over_cdp`, `selenium` through chromedriver
(/usr/bin/chromedriver, or $CLAWLOOP_CHROMEDRIVER, from the Debian package
chromium-driver) with `debuggerAddress`. Starting it here rather than letting the
driver do it gives both backends the same binary, flags, viewport (500x320, task
area 160x210 at the top left, device scale 1, en-US, UTC) and rendering, and
gives the pool exact process ids: a browser and every process it forks are
killed together (SIGKILL to the process group) on `close_browsers()`, at exit,
and when a browser hangs or dies. The group is led by a small watchdog shell
holding a pipe from this process, and chromedriver runs under the same kind of
watchdog, so they also go when this process is killed outright (SIGKILL, OOM)
and no atexit hook runs. The only network listener is chromium's DevTools port
on 127.0.0.1 (a random port; selenium's chromedriver has one more).

Playwright is the default: it needs no driver binary matched to the browser's
version, keeps one persistent connection (a step is a few short round trips; a
chromedriver command is an HTTP request that is translated into the same DevTools
calls), gives each episode its own browser context (cookies, storage and cache
are not shared between episodes; selenium episodes are tabs of one profile), can
abort requests per context, and screenshots a clip directly. Selenium is there
for setups that standardise on WebDriver and to check that results do not
depend on the driver.

The pool: per process and per backend, up to $CLAWLOOP_GUI_BROWSERS browsers
(default: the number of CPU cores, at most 4), launched when first needed; an
episode takes a new page (context) in the least busy one, so browsers are reused
across episodes and several episodes share one browser. Each browser has a
thread of its own that makes every call to it (playwright's sync API belongs to
one thread), and every call has a time limit (`ACTION_TIMEOUT_S`, or
`command_timeout_s` when smaller): a browser that does not answer in time, or
whose process has died, is killed, dropped from the pool (the next episode
launches a new one) and the episode raises `GuiBrowserError` saying what
happened. `browser_stats()` reports each browser's memory (RSS and PSS of its
process tree) and the per-call latency.

The package: `track.py` (the tasks), `env.py` (the episode; the script it puts
into every page is `page.js`, package data), `actions.py` (the `computer` tool),
`solvers.py` (the scripted solutions), `chromium.py` (the processes),
`backend.py` with `playwright_backend.py` and `selenium_backend.py` (what drives
a browser), `browser.py` (one browser and its thread), `pool.py` (the browsers
of this process).
"""

from clawloop.envs.gui.actions import COMPUTER_TOOL, ActionError
from clawloop.envs.gui.browser import ACTION_TIMEOUT_S, Browser
from clawloop.envs.gui.chromium import (BACKENDS, CHROMIUM_FLAGS, LAUNCH_TIMEOUT_S, TASK_AREA, VIEWPORT,
                                         ChromiumProcess, GuiBrowserError, chromedriver_path, chromium_path,
                                         missing_requirements, started_process_groups)
from clawloop.envs.gui.env import (DEFAULT_MAX_STEPS, DEFAULT_SYSTEM, EPISODE_TIME_MS, MAX_ELEMENTS, MAX_TEXT,
                                    SETTLE_MAX_MS, GuiEnv, effective_max_steps, format_elements, page_script)
from clawloop.envs.gui.playwright_backend import PlaywrightBackend
from clawloop.envs.gui.pool import BrowserPool, browser_pool, browser_stats, close_browsers, max_browsers
from clawloop.envs.gui.selenium_backend import SeleniumBackend
from clawloop.envs.gui.solvers import SOLVED_TASKS
from clawloop.envs.gui.track import OBSERVATIONS, TRACK, GuiTrack, all_task_ids, miniwob_dir

__all__ = [
    "ACTION_TIMEOUT_S", "BACKENDS", "CHROMIUM_FLAGS", "COMPUTER_TOOL", "DEFAULT_MAX_STEPS", "DEFAULT_SYSTEM",
    "EPISODE_TIME_MS", "LAUNCH_TIMEOUT_S", "MAX_ELEMENTS", "MAX_TEXT", "OBSERVATIONS", "SETTLE_MAX_MS",
    "SOLVED_TASKS", "TASK_AREA", "TRACK", "VIEWPORT", "ActionError", "Browser", "BrowserPool", "ChromiumProcess",
    "GuiBrowserError", "GuiEnv", "GuiTrack", "PlaywrightBackend", "SeleniumBackend", "all_task_ids",
    "browser_pool", "browser_stats", "chromedriver_path", "chromium_path", "close_browsers", "effective_max_steps",
    "format_elements", "max_browsers", "miniwob_dir", "missing_requirements", "page_script",
    "started_process_groups",
]

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
this module itself, headless, in a session (process group) of its own with a
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
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable

from clawloop.envs.base import (Env, EnvOptions, Evaluation, Observation, StepResult, Task, Track,
                                assistant_tool_call, tool_calls_of, tool_message)

log = logging.getLogger(__name__)

BACKENDS = ("playwright", "selenium")
OBSERVATIONS = ("dom", "screenshot", "both")
DEFAULT_MAX_STEPS = 15
VIEWPORT = (500, 320)
TASK_AREA = (160, 210)
ACTION_TIMEOUT_S = 30.0
LAUNCH_TIMEOUT_S = 30.0
SETTLE_MAX_MS = 1500
EPISODE_TIME_MS = 86_400_000  # a day: MiniWoB's timer never ends an episode (setTimeout caps at 2**31-1 ms)
MAX_ELEMENTS = 200
MAX_TEXT = 120

SOLVED_TASKS: tuple[str, ...] = (
    "choose-list", "click-button", "click-button-sequence", "click-checkboxes", "click-checkboxes-large",
    "click-checkboxes-soft", "click-checkboxes-transfer", "click-collapsible", "click-collapsible-2",
    "click-collapsible-2-nodelay", "click-collapsible-nodelay", "click-dialog", "click-dialog-2", "click-link",
    "click-option", "click-tab", "click-tab-2", "click-tab-2-easy", "click-tab-2-medium", "click-test",
    "click-test-2", "click-test-transfer", "click-widget", "enter-date", "enter-password", "enter-text",
    "enter-text-2", "enter-text-dynamic", "enter-time", "find-word", "focus-text", "focus-text-2",
    "grid-coordinate", "identify-shape", "login-user", "multi-layouts", "multi-orderings", "navigate-tree",
    "odd-or-even", "read-table", "read-table-2", "simple-arithmetic", "unicode-test", "use-autocomplete",
    "use-autocomplete-nodelay",
)
"""The MiniWoB++ tasks `load_tasks` lists: each has a solver in `clawloop.envs.gui_solvers`."""

COMPUTER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "computer",
        "description": (
            "Act on the web page. click: click element `ref`. type: replace the text of field `ref` with `text`. "
            "press: press `key` (Enter, Tab, Escape, Backspace, ArrowDown, Control+A, ...) in the focused element. "
            "scroll: scroll by `dx`, `dy` pixels (at element `ref` if given). click_xy: click at pixel `x`, `y` of "
            "the screenshot. select: choose `option` (its text) in dropdown `ref`. done: finish the task."),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["click", "type", "press", "scroll", "click_xy", "select",
                                                      "done"]},
                "ref": {"type": "integer", "description": "an element's ref, the number in [brackets]"},
                "text": {"type": "string", "description": "type: the text to enter"},
                "key": {"type": "string", "description": "press: the key or key combination"},
                "option": {"type": "string", "description": "select: the option's text"},
                "x": {"type": "number", "description": "click_xy: pixels from the left"},
                "y": {"type": "number", "description": "click_xy: pixels from the top"},
                "dx": {"type": "number", "description": "scroll: pixels to the right"},
                "dy": {"type": "number", "description": "scroll: pixels down"},
            },
            "required": ["action"],
        },
    },
}

DEFAULT_SYSTEM = (
    "You operate a small web page (160x210 pixels) in a browser to do the task you are given. Each observation "
    "lists the page's visible elements, one a line, as `[ref] kind \"text\"`, indented under their container; a "
    "ref stays the same for the whole task. Act with the `computer` tool: click an element, type into a field, "
    "press a key, select a dropdown option, scroll, or click at pixel coordinates of the screenshot. The task ends "
    "by itself when it is complete (usually when you press its submit button); call `done` if there is nothing "
    "left to do.")


class GuiBrowserError(RuntimeError):
    """The browser crashed, hung or could not be started: the episode cannot go on."""


class _ActionError(Exception):
    """A bad action (unknown ref, wrong arguments): answered to the agent as a tool error."""


# -- the script the env puts into every page ----------------------------------------------------------------
_PAGE_JS = r"""
(() => {
if (window.__cl) return true;
const SKIP_IDS = new Set(['reward-display', 'sync-task-cover', 'click-canvas', 'attention-canvas', 'query']);
const SKIP_TAGS = new Set(['SCRIPT', 'STYLE', 'BR', 'HEAD', 'META', 'LINK', 'NOSCRIPT', 'TEMPLATE', 'TITLE',
                           'DEFS', 'CLIPPATH', 'LINEARGRADIENT', 'RADIALGRADIENT', 'STOP']);
const SHAPES = new Set(['rect', 'circle', 'ellipse', 'polygon', 'polyline', 'path', 'line', 'text', 'image']);
const ROLES = new Set(['link', 'button', 'checkbox', 'radio', 'input', 'select', 'textarea', 'option', 'tab',
  'menuitem', 'treeitem', 'slider', 'spinbutton', 'switch', 'combobox', 'listbox', 'textbox', 'gridcell']);
const SPECIAL_INPUTS = new Set(['date', 'time', 'datetime-local', 'month', 'week', 'color', 'range']);
const pending = new Set();
const _st = window.setTimeout, _ct = window.clearTimeout;
window.setTimeout = function (fn, ms) {
  const args = Array.prototype.slice.call(arguments, 2), d = Number(ms) || 0;
  if (d > 3000) return _st.apply(window, arguments);
  let id = null;
  id = _st.call(window, function () {
    pending.delete(id);
    return typeof fn === 'function' ? fn.apply(window, args) : (0, eval)(String(fn));
  }, d);
  pending.add(id);
  return id;
};
window.clearTimeout = function (id) { pending.delete(id); return _ct.call(window, id); };
let next = 1;
const collapse = (s) => String(s == null ? '' : s).replace(/\s+/g, ' ').trim();
const cut = (s, n) => s.length > n ? s.slice(0, n - 1) + '\u2026' : s;
function clsOf(el) {
  const c = el.className;
  return collapse(typeof c === 'string' ? c : (c && c.baseVal) || '');
}
function isVisible(el) {
  if (!el.isConnected) return false;
  const r = el.getBoundingClientRect();
  if (r.width <= 0 || r.height <= 0) return false;
  if (el.checkVisibility) return el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const cs = getComputedStyle(el);
  return cs.visibility !== 'hidden' && cs.display !== 'none' && Number(cs.opacity) !== 0;
}
function roleOf(el, tag) {
  if (tag === 'a') return 'link';
  if (tag === 'button') return 'button';
  if (tag === 'input') {
    const t = (el.type || 'text').toLowerCase();
    if (['button', 'submit', 'reset', 'image'].includes(t)) return 'button';
    if (t === 'checkbox' || t === 'radio') return t;
    return 'input';
  }
  if (tag === 'select' || tag === 'textarea' || tag === 'option') return tag;
  const role = el.getAttribute('role');
  if (role) return role;
  if (el instanceof SVGElement && tag !== 'svg') return 'svg ' + tag;
  return tag;
}
function ownText(el) {
  let s = '';
  for (const n of el.childNodes) if (n.nodeType === 3) s += ' ' + n.data;
  return collapse(s);
}
function textOf(el) {
  if (el instanceof SVGElement) return collapse(el.textContent);
  return collapse(el.innerText !== undefined ? el.innerText : el.textContent);
}
function isControl(el) { return el.matches && el.matches('input,select,textarea,button'); }
function labelOf(el) {
  if (el.labels && el.labels.length) {
    const l = el.labels[0], c = l.cloneNode(true);
    c.querySelectorAll('select').forEach((s) => s.remove());
    const t = collapse(c.textContent);
    if (t) return t;
  }
  const a = el.getAttribute('aria-label') || el.getAttribute('placeholder') || el.getAttribute('title');
  if (a) return collapse(a);
  let p = el.previousElementSibling;
  if (p && !isControl(p)) { const t = textOf(p); if (t && t.length <= 40) return t; }
  let n = el.previousSibling;
  while (n && n.nodeType === 3 && !n.data.trim()) n = n.previousSibling;
  if (n && n.nodeType === 3) { const t = collapse(n.data); if (t.length <= 40) return t; }
  let cell = el.parentElement;
  for (let i = 0; i < 2 && cell; i++, cell = cell.parentElement) {
    if (cell.querySelectorAll('input,select,textarea').length !== 1) break;
    const prev = cell.previousElementSibling;
    if (prev && !prev.querySelector('input,select,textarea')) {
      const t = textOf(prev); if (t && t.length <= 40) return t;
    }
  }
  p = el.nextElementSibling;
  if (p && !isControl(p)) { const t = textOf(p); if (t && t.length <= 40) return t; }
  return '';
}
function interactive(el, tag, role) {
  if (ROLES.has(role)) return true;
  if (el.hasAttribute('onclick') || (el.hasAttribute('tabindex') && el.tabIndex >= 0)) return true;
  if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) return true;
  if (/(^|\s)(ui-button|ui-menu-item|ui-state-default|hitarea)(\s|$)/.test(clsOf(el))) return true;
  try {
    if (getComputedStyle(el).cursor === 'pointer' &&
        !(el.parentElement && getComputedStyle(el.parentElement).cursor === 'pointer')) return true;
  } catch (e) {}
  return false;
}
function record(el, ref, depth, parents) {
  const tag = el.tagName.toLowerCase(), role = roleOf(el, tag), vis = isVisible(el);
  const r = el.getBoundingClientRect();
  const rec = {ref: ref, tag: tag, role: role, visible: vis, depth: depth, parents: parents,
               rect: [Math.round(r.left), Math.round(r.top), Math.round(r.width), Math.round(r.height)]};
  if (el.id) rec.id = el.id;
  const cls = clsOf(el); if (cls) rec.cls = cls;
  const own = ownText(el); if (own) rec.own = cut(own, 300);
  const text = textOf(el); if (text) rec.text = cut(text, 300);
  const attrs = {};
  for (const a of el.attributes) {
    if (a.name === 'data-cl-ref' || a.name === 'style' || a.name === 'class' || a.name === 'id') continue;
    if (a.name.startsWith('data-wob')) continue;
    attrs[a.name] = cut(a.value, 100);
  }
  if (Object.keys(attrs).length) rec.attrs = attrs;
  if (tag === 'input' || tag === 'textarea' || tag === 'select') {
    rec.type = tag === 'input' ? (el.type || 'text').toLowerCase() : tag;
    if (tag === 'select') {
      const o = el.options[el.selectedIndex];
      rec.value = o ? collapse(o.text) : '';
    } else if (rec.type !== 'checkbox' && rec.type !== 'radio') rec.value = el.value;
    rec.label = labelOf(el);
  }
  if (role === 'checkbox' || role === 'radio') rec.checked = !!el.checked;
  if (tag === 'option') { rec.selected = !!el.selected; rec.value = el.value; }
  if (el.disabled) rec.disabled = true;
  if (document.activeElement === el && el !== document.body) rec.focused = true;
  let show = false;
  if (tag === 'option') {
    const sel = el.closest('select');
    show = !!sel && isVisible(sel);
  } else if (vis) {
    if (tag === 'label' && el.querySelector('input,select,textarea')) show = false;
    else if (interactive(el, tag, role)) show = true;
    else if (el instanceof SVGElement) show = SHAPES.has(tag);
    else show = !!own;
  }
  rec.show = show;
  return rec;
}
function walk(el, depth, parents, out) {
  if (SKIP_TAGS.has(el.tagName.toUpperCase()) || SKIP_IDS.has(el.id)) return;
  let ref = el.getAttribute('data-cl-ref');
  if (!ref) { ref = String(next++); el.setAttribute('data-cl-ref', ref); }
  const rec = record(el, +ref, depth, parents);
  if (el !== document.body) out.push(rec);
  const down = parents.concat([+ref]);
  const d = rec.show ? depth + 1 : depth;
  for (const c of el.children) walk(c, d, down, out);
}
function status() {
  let reason = typeof WOB_REWARD_REASON === 'undefined' ? null : WOB_REWARD_REASON;
  if (reason !== null && typeof reason !== 'string') {
    try { reason = JSON.stringify(reason); } catch (e) { reason = String(reason); }
  }
  return {done: !!WOB_DONE_GLOBAL, raw_reward: Number(WOB_RAW_REWARD_GLOBAL), reward: Number(WOB_REWARD_GLOBAL),
          reason: reason, episode: WOB_EPISODE_ID};
}
function utterance() {
  const u = core.getUtterance();
  return collapse(typeof u === 'string' ? u : (u && u.utterance) || '');
}
function byRef(ref) {
  const el = document.querySelector('[data-cl-ref="' + String(ref).replace(/"/g, '') + '"]');
  if (!el) throw new Error('no element [' + ref + '] on the page (use a ref from the latest observation)');
  return el;
}
function describe(el) {
  const ref = el.getAttribute && el.getAttribute('data-cl-ref');
  const tag = el.tagName.toLowerCase(), role = roleOf(el, tag);
  const field = tag === 'input' || tag === 'textarea' || tag === 'select';
  const t = cut(field ? labelOf(el) : textOf(el), 30);
  const kind = role === 'input' ? 'input ' + (el.type || 'text') : role;
  return (ref ? '[' + ref + '] ' : '') + kind + (t ? ' ' + JSON.stringify(t) : '');
}
function hits(el, x, y) {
  const h = document.elementFromPoint(x, y);
  return h && (h === el || el.contains(h) || (el.tagName === 'LABEL' && el.control === h)) ? true : h;
}
function needVisible(el, ref) {
  if (!isVisible(el)) throw new Error('element [' + ref + '] is not visible now (hidden, collapsed or closed)');
}
function pad(n) { return String(n).padStart(2, '0'); }
function normDate(s) {
  s = collapse(s);
  let m = s.match(/^(\d{4})-(\d{1,2})-(\d{1,2})$/);
  if (m) return m[1] + '-' + pad(m[2]) + '-' + pad(m[3]);
  m = s.match(/^(\d{1,2})[\/.-](\d{1,2})[\/.-](\d{4})$/);
  if (m) return m[3] + '-' + pad(m[1]) + '-' + pad(m[2]);
  return null;
}
function normTime(s) {
  s = collapse(s).toUpperCase();
  const m = s.match(/^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(AM|PM)?$/);
  if (!m) return null;
  let h = +m[1];
  if (m[4] === 'PM' && h < 12) h += 12;
  if (m[4] === 'AM' && h === 12) h = 0;
  if (h > 23 || +m[2] > 59) return null;
  return pad(h) + ':' + m[2] + (m[3] ? ':' + m[3] : '');
}
function fire(el) {
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
}
window.__cl = {
  start: function (seed, mode) {
    core.EPISODE_MAX_TIME = %(episode_ms)d;
    Math.seedrandom(seed);
    core.setDataMode(mode);
    core.startEpisodeReal();
    return true;
  },
  ready: function () { return typeof WOB_TASK_READY === 'undefined' || !!WOB_TASK_READY; },
  busy: function () {
    return pending.size > 0 || !!(window.jQuery && jQuery.timers && jQuery.timers.length);
  },
  settle: function (maxMs) {
    const t0 = Date.now(), self = this;
    return new Promise((resolve) => {
      let quiet = 0;
      const tick = () => {
        if (self.busy()) quiet = 0; else quiet++;
        if (quiet >= 2 || Date.now() - t0 > maxMs) resolve(status()); else _st.call(window, tick, 10);
      };
      if (window.requestAnimationFrame) {
        let done = false;
        const go = () => { if (!done) { done = true; tick(); } };
        requestAnimationFrame(go); _st.call(window, go, 50);
      } else tick();
    });
  },
  status: status,
  collect: function (all) {
    const out = [];
    walk(document.body, 0, [], out);
    return {utterance: utterance(), status: status(),
            scroll: [Math.round(window.scrollX), Math.round(window.scrollY)],
            elements: all ? out : out.filter((r) => r.show)};
  },
  extra: function (expr) { return (0, eval)(expr); },
  target: function (ref) {
    const el = byRef(ref);
    if (el.tagName === 'OPTION') return {option: true};
    needVisible(el, ref);
    const r0 = el.getBoundingClientRect();
    if (r0.top < 0 || r0.left < 0 || r0.bottom > innerHeight || r0.right > innerWidth)
      el.scrollIntoView({block: 'nearest', inline: 'nearest'});
    const rects = Array.from(el.getClientRects()).filter((r) => r.width > 0 && r.height > 0);
    let blocker = null;
    for (const r of rects) {
      const pts = [[0.5, 0.5], [0.3, 0.3], [0.7, 0.3], [0.3, 0.7], [0.7, 0.7], [0.1, 0.5], [0.9, 0.5],
                   [0.5, 0.1], [0.5, 0.9], [0.1, 0.1], [0.9, 0.1], [0.1, 0.9], [0.9, 0.9]];
      for (const [fx, fy] of pts) {
        const x = r.left + r.width * fx, y = r.top + r.height * fy;
        if (x < 0 || y < 0 || x >= innerWidth || y >= innerHeight) continue;
        const h = hits(el, x, y);
        if (h === true) return {x: x, y: y, what: describe(el)};
        if (!blocker && h) blocker = h;
      }
    }
    const r = rects[0] || el.getBoundingClientRect();
    return {x: r.left + r.width / 2, y: r.top + r.height / 2, what: describe(el),
            covered: blocker ? describe(blocker) : 'outside the window'};
  },
  focusField: function (ref, text) {
    const el = byRef(ref);
    needVisible(el, ref);
    const tag = el.tagName;
    const editable = el.isContentEditable;
    if (!(tag === 'INPUT' || tag === 'TEXTAREA' || editable))
      throw new Error('element [' + ref + '] (' + describe(el) + ') is not a text field');
    if (tag === 'INPUT' && ['checkbox', 'radio', 'button', 'submit', 'reset', 'image', 'file'].includes(el.type))
      throw new Error('element [' + ref + '] is a ' + el.type + ', not a text field (click it instead)');
    if (el.disabled || el.readOnly) throw new Error('element [' + ref + '] is disabled or read-only');
    el.scrollIntoView({block: 'nearest', inline: 'nearest'});
    el.focus();
    if (tag === 'INPUT' && SPECIAL_INPUTS.has(el.type)) {
      let v = String(text);
      if (el.type === 'date' && !(v = normDate(v)))
        throw new Error('a date input takes MM/DD/YYYY or YYYY-MM-DD, not ' + JSON.stringify(text));
      if (el.type === 'time' && !(v = normTime(v)))
        throw new Error('a time input takes HH:MM (24 h) or H:MM AM/PM, not ' + JSON.stringify(text));
      el.value = v;
      if (el.value !== v)
        throw new Error(JSON.stringify(text) + ' is not a valid value for this ' + el.type + ' input');
      fire(el);
      return {set: true, what: describe(el)};
    }
    if (editable) { document.execCommand('selectAll', false, null); document.execCommand('delete', false, null); }
    else if (el.value !== '') { el.value = ''; el.dispatchEvent(new Event('input', {bubbles: true})); }
    return {set: false, what: describe(el)};
  },
  select: function (ref, option) {
    let el = byRef(ref);
    if (el.tagName === 'OPTION') { option = option || el.text; el = el.closest('select'); }
    if (!el || el.tagName !== 'SELECT') throw new Error('element [' + ref + '] is not a dropdown (select)');
    needVisible(el, ref);
    if (el.disabled) throw new Error('element [' + ref + '] is disabled');
    const want = collapse(option), opts = Array.from(el.options);
    let o = opts.find((x) => collapse(x.text) === want) ||
            opts.find((x) => collapse(x.text).toLowerCase() === want.toLowerCase()) ||
            opts.find((x) => x.value === option);
    if (!o) throw new Error('dropdown [' + ref + '] has no option ' + JSON.stringify(option) + '; options: ' +
                            opts.map((x) => JSON.stringify(collapse(x.text))).join(', '));
    el.focus();
    el.selectedIndex = o.index;
    fire(el);
    return {what: describe(el), option: collapse(o.text)};
  },
  point: function (ref) {
    const el = byRef(ref);
    needVisible(el, ref);
    const r = el.getBoundingClientRect();
    return {x: Math.min(Math.max(r.left + r.width / 2, 0), innerWidth - 1),
            y: Math.min(Math.max(r.top + r.height / 2, 0), innerHeight - 1)};
  },
};
return true;
})()
""".replace("%(episode_ms)d", str(EPISODE_TIME_MS))


# -- chromium processes -------------------------------------------------------------------------------------
def chromium_path() -> str:
    return os.environ.get("CLAWLOOP_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def chromedriver_path() -> str:
    return os.environ.get("CLAWLOOP_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"


def missing_requirements(backend: str = "playwright") -> str:
    """'' when `backend` can run here, else why not (what the tests' skip reason says)."""
    import importlib.util

    if backend not in BACKENDS:
        return f"unknown screenshot backend {backend!r} (one of {', '.join(BACKENDS)})"
    why = []
    if importlib.util.find_spec("miniwob") is None:
        why.append("python package miniwob is not installed (pip install -e '.[gui]')")
    if importlib.util.find_spec(backend) is None:
        why.append(f"python package {backend} is not installed (pip install -e '.[gui]')")
    if not os.access(chromium_path(), os.X_OK):
        why.append(f"no chromium at {chromium_path()} (make sysdeps, or set CLAWLOOP_CHROMIUM)")
    if backend == "selenium" and not os.access(chromedriver_path(), os.X_OK):
        why.append(f"no chromedriver at {chromedriver_path()} (apt-get install chromium-driver, or set "
                   "CLAWLOOP_CHROMEDRIVER)")
    return "; ".join(why)


CHROMIUM_FLAGS = [
    "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
    "--disable-background-networking", "--disable-sync", "--disable-component-update", "--disable-default-apps",
    "--disable-breakpad", "--disable-crash-reporter", "--disable-domain-reliability", "--mute-audio",
    "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows", "--disable-features=Translate,MediaRouter,OptimizationHints,"
    "AutofillServerCommunication,CertificateTransparencyComponentUpdater,DialMediaRouteProvider",
    "--disable-dev-shm-usage", "--password-store=basic", "--use-mock-keychain", "--metrics-recording-only",
    f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "--force-device-scale-factor=1", "--lang=en-US",
    # no network: every host is unresolvable and every http(s)/ws request goes to a closed port
    "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
]


def _group_pids(pgid: int) -> list[int]:
    """Processes whose process group is `pgid` (a browser and every process it forked)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d))
    return out


def _own_children(word: str) -> list[int]:
    """Child processes of this process whose command line mentions `word`."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            if int(stat[stat.rfind(")") + 2:].split()[1]) != me:
                continue
            if word in Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace"):
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _memory_of(pids: list[int]) -> dict[str, float]:
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return {"processes": len(pids), "rss_mb": round(rss / 1024, 1), "pss_mb": round(pss / 1024, 1)}


class ChromiumProcess:
    """One headless chromium in a process group of its own, with a throwaway profile."""

    def __init__(self, label: str = ""):
        self.dir = tempfile.mkdtemp(prefix=f"clawloop-chromium-{label}-")
        self.profile = Path(self.dir) / "profile"
        self.profile.mkdir()
        self.log_path = Path(self.dir) / "chromium.log"
        self.proc: subprocess.Popen | None = None
        self.chromium_pid = 0
        self.port = 0
        self.sandboxed = os.geteuid() != 0 and os.environ.get("CLAWLOOP_CHROMIUM_NO_SANDBOX") != "1"
        self.launch_s = 0.0

    def start(self, timeout_s: float = LAUNCH_TIMEOUT_S) -> "ChromiumProcess":
        t0 = time.monotonic()
        try:
            self._start(timeout_s)
        except GuiBrowserError as e:
            if not self.sandboxed or "sandbox" not in str(e).lower():
                raise
            log.warning("gui: chromium's sandbox is not usable here; running it with --no-sandbox")
            self.kill()
            self.sandboxed = False
            self._start(timeout_s)
        self.launch_s = time.monotonic() - t0
        return self

    def _start(self, timeout_s: float) -> None:
        args = [chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}"]
        if not self.sandboxed:
            args.append("--no-sandbox")
        args.append("about:blank")
        env = dict(os.environ, TZ="UTC", LANG="en_US.UTF-8", LANGUAGE="en_US")
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(["/bin/sh", "-c", _WATCHDOG, "clawloop-chromium", *args],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, env=env,
                                         start_new_session=True, close_fds=True)
        _register_group(self.proc.pid)
        line = self.proc.stdout.readline().strip()
        self.proc.stdout.close()
        if not line.isdigit():
            raise GuiBrowserError(f"could not start chromium: {self.log_tail()}")
        self.chromium_pid = int(line)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise GuiBrowserError(f"chromium exited at start: {self.log_tail()}")
            try:
                lines = port_file.read_text().split()
            except OSError:
                lines = []
            if len(lines) >= 2 and lines[0].isdigit():
                self.port = int(lines[0])
                return
            time.sleep(0.02)
        raise GuiBrowserError(f"chromium did not open its DevTools port in {timeout_s:g} s: {self.log_tail()}")

    def log_tail(self, n: int = 600) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip() and "dbus" not in ln.lower()
                 and "unexpected operator" not in ln]
        return " | ".join(lines)[-n:]

    @property
    def pid(self) -> int:
        """The browser process (the leader of its process group is the watchdog shell, `pgid`)."""
        return self.chromium_pid

    @property
    def pgid(self) -> int:
        return self.proc.pid if self.proc else 0

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None or not self.chromium_pid:
            return False
        try:
            stat = Path(f"/proc/{self.chromium_pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")

    def pids(self) -> list[int]:
        return _group_pids(self.pgid) if self.proc else []

    def memory(self) -> dict[str, float]:
        return _memory_of(self.pids())

    def kill(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc.pid)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self.proc.stdin:
                self.proc.stdin.close()
            _unregister_group(self.proc.pid)
        shutil.rmtree(self.dir, ignore_errors=True)


# chromium runs under a watchdog shell that leads its process group and holds the read end of a pipe this
# process keeps open: when this process goes, however it goes, the read ends and the shell kills the group.
_WATCHDOG = '"$@" </dev/null >&2 & echo $!; read _; kill -9 -$$'

_GROUPS: set[int] = set()
_GROUPS_LOCK = threading.Lock()


def _register_group(pgid: int) -> None:
    with _GROUPS_LOCK:
        _GROUPS.add(pgid)


def _unregister_group(pgid: int) -> None:
    with _GROUPS_LOCK:
        _GROUPS.discard(pgid)


def _kill_group(pgid: int) -> None:
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    # a process that left the group (setsid) is not followed; chromium's helpers stay in it
    for _ in range(50):
        if not _group_pids(pgid):
            break
        time.sleep(0.02)


def started_process_groups() -> list[int]:
    """Process groups of the chromium (and chromedriver) processes this process started and has not killed."""
    with _GROUPS_LOCK:
        return sorted(_GROUPS)


# -- backends: what drives a browser (every method runs on the browser's own thread) ---------------------------
def _keys_of(key: str) -> list[str]:
    """'ctrl+a' -> ['Control', 'a']; Playwright's key names."""
    names = {"enter": "Enter", "return": "Enter", "tab": "Tab", "escape": "Escape", "esc": "Escape",
             "backspace": "Backspace", "delete": "Delete", "del": "Delete", "space": " ", "spacebar": " ",
             "arrowup": "ArrowUp", "up": "ArrowUp", "arrowdown": "ArrowDown", "down": "ArrowDown",
             "arrowleft": "ArrowLeft", "left": "ArrowLeft", "arrowright": "ArrowRight", "right": "ArrowRight",
             "home": "Home", "end": "End", "pageup": "PageUp", "pagedown": "PageDown", "insert": "Insert",
             "control": "Control", "ctrl": "Control", "shift": "Shift", "alt": "Alt", "option": "Alt",
             "meta": "Meta", "cmd": "Meta", "command": "Meta", "super": "Meta"}
    names.update({f"f{i}": f"F{i}" for i in range(1, 13)})
    key = key.strip()
    if not key:
        raise _ActionError("press needs a non-empty `key`, e.g. Enter, Tab, ArrowDown or Control+A")
    parts = [key] if key == "+" else [p for p in re.split(r"\s*\+\s*", key) if p] or ["+"]
    out = []
    for p in parts:
        if len(p) == 1:
            out.append(p)
        elif p.lower() in names:
            out.append(names[p.lower()])
        else:
            raise _ActionError(f"unknown key {p!r}: use a single character or one of Enter, Tab, Escape, "
                               "Backspace, Delete, Space, ArrowUp/Down/Left/Right, Home, End, PageUp, PageDown, "
                               "F1-F12, with Control/Shift/Alt/Meta+ for combinations")
    return out


class _Backend:
    name = ""

    def start(self, port: int, action_timeout_s: float) -> None: ...
    def version(self) -> str: return ""
    def new_page(self) -> Any: ...
    def close_page(self, page: Any) -> None: ...
    def goto(self, page: Any, url: str) -> None: ...
    def eval(self, page: Any, fn: str, arg: Any = None) -> Any: ...
    def click(self, page: Any, x: float, y: float) -> None: ...
    def type_text(self, page: Any, text: str) -> None: ...
    def press(self, page: Any, keys: list[str]) -> None: ...
    def wheel(self, page: Any, x: float, y: float, dx: float, dy: float) -> None: ...
    def screenshot(self, page: Any) -> bytes: ...
    def stop(self) -> None: ...
    def extra_pids(self) -> list[int]: return []


class PlaywrightBackend(_Backend):
    name = "playwright"

    def start(self, port: int, action_timeout_s: float) -> None:
        from playwright.sync_api import sync_playwright

        self.timeout_ms = action_timeout_s * 1000
        before = _own_children("playwright")
        self.pw = sync_playwright().start()
        self.driver_pids = sorted(set(_own_children("playwright")) - set(before))  # its node driver (not killed
        # here: it exits with its pipe, when `stop` or this process ends)
        self.browser = self.pw.chromium.connect_over_cdp(f"http://127.0.0.1:{port}", timeout=self.timeout_ms)

    def version(self) -> str:
        return self.browser.version

    def new_page(self) -> Any:
        ctx = self.browser.new_context(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]}, device_scale_factor=1,
                                       locale="en-US", timezone_id="UTC", service_workers="block",
                                       accept_downloads=False)
        ctx.route(lambda url: not url.startswith(("file:", "data:", "about:", "blob:")), lambda route: route.abort())
        ctx.set_default_timeout(self.timeout_ms)
        page = ctx.new_page()
        return page

    def close_page(self, page: Any) -> None:
        page.context.close()

    def goto(self, page: Any, url: str) -> None:
        page.goto(url, wait_until="load")

    def eval(self, page: Any, fn: str, arg: Any = None) -> Any:
        return page.evaluate(fn, arg)

    def click(self, page: Any, x: float, y: float) -> None:
        page.mouse.click(x, y)

    def type_text(self, page: Any, text: str) -> None:
        page.keyboard.type(text)

    def press(self, page: Any, keys: list[str]) -> None:
        page.keyboard.press("+".join(keys))

    def wheel(self, page: Any, x: float, y: float, dx: float, dy: float) -> None:
        page.mouse.move(x, y)
        page.mouse.wheel(dx, dy)

    def screenshot(self, page: Any) -> bytes:
        return page.screenshot(type="png", clip={"x": 0, "y": 0, "width": TASK_AREA[0], "height": TASK_AREA[1]})

    def extra_pids(self) -> list[int]:
        return [p for p in self.driver_pids if Path(f"/proc/{p}").exists()]

    def stop(self) -> None:
        try:
            self.browser.close()
        finally:
            self.pw.stop()


class SeleniumBackend(_Backend):
    name = "selenium"

    def start(self, port: int, action_timeout_s: float) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.debugger_address = f"127.0.0.1:{port}"
        self.service = Service(executable_path=self._watched_driver(), log_output=subprocess.DEVNULL,
                               popen_kw={"start_new_session": True})
        self.driver = webdriver.Chrome(service=self.service, options=options)
        proc = getattr(self.service, "process", None)
        self.driver_pid = proc.pid if proc is not None else 0
        if self.driver_pid:
            _register_group(self.driver_pid)
        self.driver.set_script_timeout(action_timeout_s)
        self.driver.set_page_load_timeout(action_timeout_s)
        self.home = self.driver.current_window_handle  # the first tab stays open: closing the last ends the session
        self.current = self.home

    def _watched_driver(self) -> str:
        """chromedriver under the same kind of watchdog as chromium (selenium keeps its stdin open): it goes
        with this process however this process ends. Plain chromedriver where a script cannot run."""
        import shlex

        path = Path(tempfile.mkdtemp(prefix="clawloop-chromedriver-")) / "chromedriver"
        self.wrapper_dir = str(path.parent)
        path.write_text(f"#!/bin/sh\n{shlex.quote(chromedriver_path())} \"$@\" </dev/null &\nread _\nkill -9 -$$\n")
        path.chmod(0o700)
        if os.statvfs(path.parent).f_flag & os.ST_NOEXEC:
            return chromedriver_path()
        return str(path)

    def version(self) -> str:
        return str(self.driver.capabilities.get("browserVersion", ""))

    def extra_pids(self) -> list[int]:
        return _group_pids(self.driver_pid) if self.driver_pid else []

    def _on(self, page: Any) -> None:
        if self.current != page:
            self.driver.switch_to.window(page)
            self.current = page

    def new_page(self) -> Any:
        self.driver.switch_to.new_window("tab")
        self.current = handle = self.driver.current_window_handle
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                    {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1,
                                     "mobile": False})
        self.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "UTC"})
        self.driver.execute_cdp_cmd("Emulation.setLocaleOverride", {"locale": "en-US"})
        return handle

    def close_page(self, page: Any) -> None:
        self._on(page)
        self.driver.close()
        self.driver.switch_to.window(self.home)
        self.current = self.home

    def goto(self, page: Any, url: str) -> None:
        self._on(page)
        self.driver.get(url)

    def eval(self, page: Any, fn: str, arg: Any = None) -> Any:
        self._on(page)
        return self.driver.execute_script(f"return ({fn})(arguments[0]);", arg)

    def click(self, page: Any, x: float, y: float) -> None:
        from selenium.webdriver.common.actions.action_builder import ActionBuilder

        self._on(page)
        ab = ActionBuilder(self.driver, duration=0)
        ab.pointer_action.move_to_location(int(round(x)), int(round(y)))
        ab.pointer_action.click()
        ab.perform()

    def type_text(self, page: Any, text: str) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        self._on(page)
        ActionChains(self.driver, duration=0).send_keys(text).perform()

    def press(self, page: Any, keys: list[str]) -> None:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        special = {"Enter": Keys.ENTER, "Tab": Keys.TAB, "Escape": Keys.ESCAPE, "Backspace": Keys.BACKSPACE,
                   "Delete": Keys.DELETE, "ArrowUp": Keys.ARROW_UP, "ArrowDown": Keys.ARROW_DOWN,
                   "ArrowLeft": Keys.ARROW_LEFT, "ArrowRight": Keys.ARROW_RIGHT, "Home": Keys.HOME, "End": Keys.END,
                   "PageUp": Keys.PAGE_UP, "PageDown": Keys.PAGE_DOWN, "Insert": Keys.INSERT,
                   "Control": Keys.CONTROL, "Shift": Keys.SHIFT, "Alt": Keys.ALT, "Meta": Keys.META}
        special.update({f"F{i}": getattr(Keys, f"F{i}") for i in range(1, 13)})
        self._on(page)
        codes = [special.get(k, k) for k in keys]
        chain = ActionChains(self.driver, duration=0)
        for mod in codes[:-1]:
            chain.key_down(mod)
        chain.send_keys(codes[-1])
        for mod in reversed(codes[:-1]):
            chain.key_up(mod)
        chain.perform()

    def wheel(self, page: Any, x: float, y: float, dx: float, dy: float) -> None:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

        self._on(page)
        ActionChains(self.driver, duration=0).scroll_from_origin(
            ScrollOrigin.from_viewport(int(x), int(y)), int(dx), int(dy)).perform()

    def screenshot(self, page: Any) -> bytes:
        self._on(page)
        sx, sy = self.driver.execute_script("return [window.scrollX, window.scrollY];")
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "clip": {"x": sx, "y": sy, "width": TASK_AREA[0], "height": TASK_AREA[1], "scale": 1}})
        return base64.b64decode(shot["data"])

    def stop(self) -> None:
        try:
            if getattr(self, "driver", None) is not None:
                self.driver.quit()
        finally:
            if getattr(self, "driver_pid", 0):
                _kill_group(self.driver_pid)
                _unregister_group(self.driver_pid)
            if getattr(self, "wrapper_dir", ""):
                shutil.rmtree(self.wrapper_dir, ignore_errors=True)


# -- one browser: a chromium process, its driver, and the thread that talks to it ---------------------------------
class Browser:
    def __init__(self, backend: str, index: int, action_timeout_s: float = ACTION_TIMEOUT_S):
        self.backend_name = backend
        self.index = index
        self.action_timeout_s = action_timeout_s
        self.chromium = ChromiumProcess(f"{backend}{index}")
        self.backend: _Backend = PlaywrightBackend() if backend == "playwright" else SeleniumBackend()
        self.pages = 0
        self.episodes = 0
        self.dead: str | None = None
        self._started = self._stopped = False
        self.version = ""
        self.calls = 0
        self.call_s = 0.0
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"gui-{backend}-{index}")
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                if not self._stopped:  # killed: let the driver go too (playwright's node process, chromedriver)
                    try:
                        self._stop_backend()
                    except Exception as e:  # noqa: BLE001 - its browser is gone already
                        log.debug("gui: stopping the driver of a dead browser: %s", e)
                return
            fn, args, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def _launch(self) -> str:
        self.chromium.start()
        self._started = True
        self.backend.start(self.chromium.port, self.action_timeout_s)
        return self.backend.version()

    def launch(self) -> None:
        try:
            self.version = self.call("launch", self._launch, timeout=LAUNCH_TIMEOUT_S + self.action_timeout_s)
        except Exception:
            self.kill("could not start")
            raise

    def call(self, what: str, fn: Callable, *args, timeout: float | None = None) -> Any:
        """Run fn(*args) on this browser's thread; a hang or a dead browser raises GuiBrowserError."""
        if self.dead:
            raise GuiBrowserError(f"browser {self.backend_name}#{self.index} is gone ({self.dead})")
        fut: Future = Future()
        t0 = time.monotonic()
        self._q.put((fn, args, fut))
        limit = timeout or self.action_timeout_s
        try:
            out = fut.result(timeout=limit)
        except FutureTimeout:
            self.kill(f"no answer to {what} in {limit:g} s")
            raise GuiBrowserError(f"the browser hung: no answer to {what} in {limit:g} s (chromium pid "
                                  f"{self.chromium.pid} killed; the next episode starts a new one)") from None
        except GuiBrowserError:
            raise
        except Exception as e:
            if not self.chromium.alive():
                self.kill("chromium exited")
                raise GuiBrowserError(f"the browser crashed during {what}: chromium pid {self.chromium.pid} "
                                      f"is gone ({type(e).__name__}: {str(e)[:200]}); the next episode starts a "
                                      "new one") from e
            raise
        finally:
            self.calls += 1
            self.call_s += time.monotonic() - t0
        return out

    def kill(self, why: str) -> None:
        """Kill chromium (its whole process group) and the driver; pending calls fail."""
        if self.dead is None:
            self.dead = why
        self.chromium.kill()
        drv = getattr(self.backend, "driver_pid", 0)
        if drv:
            _kill_group(drv)
            _unregister_group(drv)
        self._q.put(None)

    def _stop_backend(self) -> None:
        if not self._stopped and self._started:
            self._stopped = True
            self.backend.stop()

    def close(self) -> None:
        if self.dead is None and self.chromium.alive():
            try:
                self.call("stop", self._stop_backend, timeout=10)
            except Exception as e:  # noqa: BLE001 - killed below anyway
                log.debug("gui: stopping %s#%d: %s", self.backend_name, self.index, e)
        self.kill("closed")
        self._thread.join(timeout=5)

    def stats(self) -> dict[str, Any]:
        mem = self.chromium.memory() if self.dead is None else {}
        drv = _memory_of(self.backend.extra_pids()) if self.dead is None and self.backend.extra_pids() else None
        return {"backend": self.backend_name, "index": self.index, "pid": self.chromium.pid, "dead": self.dead,
                "pages": self.pages, "episodes": self.episodes, "launch_s": round(self.chromium.launch_s, 3),
                "sandboxed": self.chromium.sandboxed, "calls": self.calls,
                "mean_call_ms": round(1000 * self.call_s / self.calls, 2) if self.calls else None,
                **mem, **({"driver": drv} if drv else {})}


class BrowserPool:
    """Browsers of one backend, shared by the episodes of this process."""

    def __init__(self, backend: str, max_browsers: int):
        self.backend = backend
        self.max_browsers = max(1, max_browsers)
        self.browsers: list[Browser] = []
        self._lock = threading.Lock()
        self._launching = threading.Lock()
        self._next = 0

    def acquire(self, action_timeout_s: float) -> Browser:
        with self._launching:
            with self._lock:
                for b in self.browsers:
                    if not b.dead and not b.chromium.alive():
                        b.kill("chromium exited while idle")
                self.browsers = [b for b in self.browsers if not b.dead]
                live = sorted(self.browsers, key=lambda b: (b.pages, b.index))
                if live and (live[0].pages == 0 or len(live) >= self.max_browsers):
                    live[0].pages += 1
                    live[0].episodes += 1
                    return live[0]
                index, self._next = self._next, self._next + 1
            b = Browser(self.backend, index, action_timeout_s)
            b.launch()
            with self._lock:
                b.pages += 1
                b.episodes += 1
                self.browsers.append(b)
            return b

    def release(self, b: Browser) -> None:
        with self._lock:
            b.pages = max(0, b.pages - 1)

    def close(self) -> None:
        with self._lock:
            browsers, self.browsers = self.browsers, []
        for b in browsers:
            b.close()


_POOLS: dict[str, BrowserPool] = {}
_POOLS_LOCK = threading.Lock()


def max_browsers() -> int:
    try:
        return max(1, int(os.environ.get("CLAWLOOP_GUI_BROWSERS", "")))
    except ValueError:
        return max(1, min(4, os.cpu_count() or 1))


def browser_pool(backend: str) -> BrowserPool:
    with _POOLS_LOCK:
        pool = _POOLS.get(backend)
        if pool is None:
            pool = _POOLS[backend] = BrowserPool(backend, max_browsers())
        return pool


def browser_stats() -> list[dict[str, Any]]:
    """Every live browser of this process: memory (RSS/PSS of its process tree, MB) and call latency."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    return [b.stats() for p in pools for b in list(p.browsers)]


def close_browsers() -> None:
    """Kill every browser this process started (also run at exit)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for p in pools:
        p.close()
    for pgid in started_process_groups():
        _kill_group(pgid)
        _unregister_group(pgid)


atexit.register(close_browsers)


# -- the track ------------------------------------------------------------------------------------------------
def miniwob_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.origin:
        raise ValueError("the gui track needs the miniwob package: pip install -e '.[gui]'")
    return Path(spec.origin).parent / "html" / "miniwob"


def all_task_ids() -> list[str]:
    """Every MiniWoB++ page the package ships (not the flight.* tasks, which need a web server)."""
    return sorted(p.stem for p in miniwob_dir().glob("*.html"))


def effective_max_steps(opts: EnvOptions) -> int:
    """The track's own default (15) when the caller left the generic one (20)."""
    default = EnvOptions.__dataclass_fields__["max_steps"].default
    return DEFAULT_MAX_STEPS if opts.max_steps == default else max(1, opts.max_steps)


class GuiTrack(Track):
    name = "gui"

    def _task(self, task_id: str, html: Path) -> Task:
        from clawloop.envs.gui_solvers import SOLVERS

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


def _num(args: dict[str, Any], key: str, *, required: bool = True, default: float = 0.0) -> float:
    v = args.get(key)
    if v is None:
        if required:
            raise _ActionError(f"`{key}` is required for this action")
        return default
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise _ActionError(f"`{key}` must be a number, not {v!r}") from None
    if not math.isfinite(f):
        raise _ActionError(f"`{key}` must be a finite number")
    return f


def _ref(args: dict[str, Any], *, required: bool = True) -> int | None:
    v = args.get("ref")
    if v is None or v == "":
        if required:
            raise _ActionError("`ref` is required: the number in [brackets] before an element in the observation")
        return None
    if isinstance(v, bool):
        raise _ActionError(f"`ref` must be an element's number, not {v!r}")
    if isinstance(v, (int, float)) and float(v).is_integer():
        return int(v)
    m = re.fullmatch(r"\s*\[?\s*(\d+)\s*\]?\s*", str(v))
    if not m:
        raise _ActionError(f"`ref` must be an element's number such as 3, not {v!r}")
    return int(m.group(1))


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
                    raise _ActionError(f"no tool named {c['name']!r}; the tool is `computer`")
                if c["arguments"] is None:
                    raise _ActionError(f"arguments are not a JSON object: {c['raw'][:200]}")
                text, info = self._act(c["arguments"])
            except _ActionError as e:
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

    def _page_error(self, e: Exception) -> _ActionError:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = re.sub(r"^(Page\.evaluate|Error|JavascriptException|Message):\s*", "", msg)
        msg = re.sub(r"^(Error|Uncaught Error|javascript error):\s*", "", msg)
        return _ActionError(msg[:300])

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
                ref = _ref(args)
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
                ref = _ref(args)
                text = args.get("text")
                if not isinstance(text, str):
                    raise _ActionError("`text` (a string) is required for type")
                if len(text) > 500:
                    raise _ActionError("`text` is longer than 500 characters")
                res = self._js("type", "(a) => __cl.focusField(a[0], a[1])", [ref, text])
                if not res.get("set"):
                    self._call("type", b.type_text, text)
                self._after()
                return f"ok: typed {_q(text)} into {res['what']}", {"ref": ref}
            if action == "press":
                key = args.get("key")
                if not isinstance(key, str):
                    raise _ActionError("`key` (a string such as Enter) is required for press")
                keys = _keys_of(key)
                self._call("press", b.press, keys)
                self._after()
                return f"ok: pressed {'+'.join(keys)}", {"key": "+".join(keys)}
            if action == "scroll":
                dx, dy = _num(args, "dx", required=False), _num(args, "dy", required=False)
                if dx == 0 and dy == 0:
                    raise _ActionError("scroll needs `dx` and/or `dy` (pixels; positive dy scrolls down)")
                ref = _ref(args, required=False)
                if ref is not None:
                    p = self._js("scroll", "(r) => __cl.point(r)", ref)
                    x, y = p["x"], p["y"]
                else:
                    x, y = TASK_AREA[0] / 2, TASK_AREA[1] / 2
                self._call("scroll", b.wheel, x, y, max(-5000, min(5000, dx)), max(-5000, min(5000, dy)))
                self._after()
                return f"ok: scrolled by ({dx:g}, {dy:g})", {"ref": ref}
            if action == "click_xy":
                x, y = _num(args, "x"), _num(args, "y")
                if not (0 <= x < VIEWPORT[0] and 0 <= y < VIEWPORT[1]):
                    raise _ActionError(f"x, y must be inside the page (0 <= x < {VIEWPORT[0]}, 0 <= y < "
                                       f"{VIEWPORT[1]}); the task area is {TASK_AREA[0]}x{TASK_AREA[1]}")
                self._call("click_xy", b.click, x, y)
                self._after()
                return f"ok: clicked at ({x:g}, {y:g})", {"x": x, "y": y}
            if action == "select":
                ref = _ref(args)
                option = args.get("option", args.get("text"))
                if not isinstance(option, str):
                    raise _ActionError("`option` (the option's text) is required for select")
                res = self._js("select", "(a) => __cl.select(a[0], a[1])", [ref, option])
                self._after()
                return f"ok: selected {_q(res['option'])} in {res['what']}", {"ref": ref}
            raise _ActionError(f"unknown action {action!r}: one of click, type, press, scroll, click_xy, select, done")
        except (_ActionError, GuiBrowserError):
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
        from clawloop.envs.gui_solvers import SOLVERS, solve

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


TRACK = GuiTrack()

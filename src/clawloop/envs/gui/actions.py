"""What the GUI agent can do: the one `computer` tool and the parsing of its arguments.

A bad action (unknown ref, wrong arguments, an unknown key) raises `ActionError`,
which the env answers to the agent as a readable tool error; the step goes on.
"""

from __future__ import annotations

import math
import re
from typing import Any


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


class ActionError(Exception):
    """A bad action (unknown ref, wrong arguments): answered to the agent as a tool error."""


def keys_of(key: str) -> list[str]:
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
        raise ActionError("press needs a non-empty `key`, e.g. Enter, Tab, ArrowDown or Control+A")
    parts = [key] if key == "+" else [p for p in re.split(r"\s*\+\s*", key) if p] or ["+"]
    out = []
    for p in parts:
        if len(p) == 1:
            out.append(p)
        elif p.lower() in names:
            out.append(names[p.lower()])
        else:
            raise ActionError(f"unknown key {p!r}: use a single character or one of Enter, Tab, Escape, "
                               "Backspace, Delete, Space, ArrowUp/Down/Left/Right, Home, End, PageUp, PageDown, "
                               "F1-F12, with Control/Shift/Alt/Meta+ for combinations")
    return out


def number_arg(args: dict[str, Any], key: str, *, required: bool = True, default: float = 0.0) -> float:
    v = args.get(key)
    if v is None:
        if required:
            raise ActionError(f"`{key}` is required for this action")
        return default
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ActionError(f"`{key}` must be a number, not {v!r}") from None
    if not math.isfinite(f):
        raise ActionError(f"`{key}` must be a finite number")
    return f


def ref_arg(args: dict[str, Any], *, required: bool = True) -> int | None:
    v = args.get("ref")
    if v is None or v == "":
        if required:
            raise ActionError("`ref` is required: the number in [brackets] before an element in the observation")
        return None
    if isinstance(v, bool):
        raise ActionError(f"`ref` must be an element's number, not {v!r}")
    if isinstance(v, (int, float)) and float(v).is_integer():
        return int(v)
    m = re.fullmatch(r"\s*\[?\s*(\d+)\s*\]?\s*", str(v))
    if not m:
        raise ActionError(f"`ref` must be an element's number such as 3, not {v!r}")
    return int(m.group(1))

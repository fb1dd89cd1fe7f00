"""Scripted solutions of the GUI track's MiniWoB++ tasks: the page's state in, the `computer` actions out.

A solver reads what the page shows at the start of the episode (the state
`GuiEnv.page_state` returns: the utterance and every element the env's script
gave a ref, hidden ones too, with tag, role, text, attributes, value, label,
visibility and the refs of its ancestors, root first) and returns the list of
`computer` tool arguments that do the task, e.g.
`[{"action": "type", "ref": 5, "text": "Kenda"}, {"action": "click", "ref": 6}]`.
Elements that are hidden at the start (a collapsed section's content, a closed
tab, a folded tree branch) already have refs, so a plan can open them and then
use what was inside. A few solvers also read one value of the page's script
(`SOLVERS[task] = (function, JS expression)`), e.g. the list of countries an
autocomplete offers.

The tasks are random per seed, so nothing here is a recorded answer: each
solver parses the utterance and looks the answer up in the page.
"""

from __future__ import annotations

import re
from typing import Any, Callable

State = dict[str, Any]
Action = dict[str, Any]


class SolverError(ValueError):
    """The page is not what the solver expects (a changed task page, a bug)."""


# -- reading the state ----------------------------------------------------------------------------------------
def quoted(state: State) -> list[str]:
    return re.findall(r'"([^"]*)"', state["utterance"])


def elements(state: State, *, visible: bool | None = None, **match: Any) -> list[dict[str, Any]]:
    """Elements whose fields equal `match` (`cls` matches one class name; `attr_<name>` an attribute)."""
    out = []
    for e in state["elements"]:
        if visible is not None and bool(e.get("visible")) != visible:
            continue
        ok = True
        for k, v in match.items():
            if k == "cls":
                ok = v in (e.get("cls") or "").split()
            elif k.startswith("attr_"):
                ok = (e.get("attrs") or {}).get(k[5:].replace("_", "-")) == v
            else:
                ok = e.get(k) == v
            if not ok:
                break
        if ok:
            out.append(e)
    return out


def one(state: State, what: str, **match: Any) -> dict[str, Any]:
    """The first visible element matching, else the first hidden one."""
    found = elements(state, visible=True, **match) or elements(state, **match)
    if not found:
        raise SolverError(f"{state.get('task_id')}: no {what} on the page ({match})")
    return found[0]


def get(state: State, ref: int) -> dict[str, Any] | None:
    for e in state["elements"]:
        if e["ref"] == ref:
            return e
    return None


def by_ref(state: State, ref: int) -> dict[str, Any]:
    e = get(state, ref)
    if e is None:
        raise SolverError(f"no element [{ref}]")
    return e


def children(state: State, parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in state["elements"] if e.get("parents") and e["parents"][-1] == parent["ref"]]


def inside(state: State, container: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in state["elements"] if container["ref"] in (e.get("parents") or [])]


def button(state: State, text: str) -> dict[str, Any]:
    found = [e for e in elements(state, role="button") if e.get("text", "").strip() == text]
    found.sort(key=lambda e: not e.get("visible"))
    if not found:
        raise SolverError(f"{state.get('task_id')}: no button {text!r}")
    return found[0]


def click(e: dict[str, Any]) -> Action:
    return {"action": "click", "ref": e["ref"]}


def type_(e: dict[str, Any], text: str) -> Action:
    return {"action": "type", "ref": e["ref"], "text": text}


def submit(state: State) -> Action:
    return click(button(state, "Submit"))


def _need(m: re.Match | None, state: State, what: str) -> re.Match:
    if m is None:
        raise SolverError(f"{state.get('task_id')}: cannot read {what} from {state['utterance']!r}")
    return m


# -- the solvers ------------------------------------------------------------------------------------------------
def click_named_button(state: State) -> list[Action]:
    return [click(button(state, quoted(state)[0]))]


def click_button_sequence(state: State) -> list[Action]:
    return [click(button(state, "ONE")), click(button(state, "TWO"))]


def click_test(state: State) -> list[Action]:
    return [click(one(state, "button", role="button", id="subbtn"))]


def click_test_2(state: State) -> list[Action]:
    return [click(button(state, "ONE"))]


def click_test_transfer(state: State) -> list[Action]:
    which = _need(re.search(r"Click button (\w+)", state["utterance"]), state, "the button").group(1)
    return [click(button(state, which))]


def _names(state: State, prefix: str) -> list[str]:
    m = _need(re.search(prefix + r"(.*) and click Submit\.", state["utterance"]), state, "the names")
    names = [n.strip() for n in m.group(1).split(",")]
    return [] if names == ["nothing"] else names


def _check_only(state: State, want: Callable[[str], bool]) -> list[Action]:
    acts = [click(e) for e in elements(state, role="checkbox") if want(e.get("label", "")) != bool(e.get("checked"))]
    return acts + [submit(state)]


def click_checkboxes(state: State) -> list[Action]:
    names = set(_names(state, r"Select "))
    return _check_only(state, lambda label: label in names)


def click_checkboxes_soft(state: State) -> list[Action]:
    groups: list[list[str]] = state["extra"]
    words = _names(state, r"Select words similar to ")
    similar = {w for g in groups if any(q in g for q in words) for w in g}
    return _check_only(state, lambda label: label in similar)


def click_collapsible(state: State) -> list[Action]:
    header = one(state, "section header", tag="h3")
    return [click(header), click(one(state, "submit button", id="subbtn"))]


def _section_header(state: State, e: dict[str, Any]) -> dict[str, Any]:
    """The accordion header (h3) just before the content section holding `e`."""
    content = by_ref(state, e["parents"][-1])
    headers = [h for h in state["elements"] if h["tag"] == "h3" and h.get("parents") == content.get("parents")]
    before = [h for h in headers if state["elements"].index(h) < state["elements"].index(content)]
    if not before:
        raise SolverError(f"{state.get('task_id')}: no section header above [{content['ref']}]")
    return before[-1]


def click_collapsible_2(state: State) -> list[Action]:
    target = quoted(state)[0]
    links = [e for e in elements(state, cls="alink") if e.get("text") == target]
    if not links:
        raise SolverError(f"no link {target!r}")
    link = links[0]
    acts = [] if link.get("visible") else [click(_section_header(state, link))]
    return acts + [click(link)]


def click_dialog(state: State) -> list[Action]:
    return [click(one(state, "dialog close button", cls="ui-dialog-titlebar-close"))]


def click_dialog_2(state: State) -> list[Action]:
    want = quoted(state)[0]
    if want == "x":
        return click_dialog(state)
    return [click(button(state, want))]


def click_link(state: State) -> list[Action]:
    target = quoted(state)[0]
    return [click(one(state, f"link {target!r}", cls="alink", text=target))]


def click_option(state: State) -> list[Action]:
    name = _names(state, r"Select ")[0]
    return [click(one(state, f"radio {name!r}", role="radio", label=name)), submit(state)]


def click_tab(state: State) -> list[Action]:
    n = _need(re.search(r"Tab #(\d+)", state["utterance"]), state, "the tab").group(1)
    return [click(one(state, f"tab {n}", role="link", text=f"Tab #{n}"))]


def _panel_of(state: State, e: dict[str, Any]) -> dict[str, Any] | None:
    for ref in reversed(e.get("parents") or []):
        p = get(state, ref)
        if p is not None and re.fullmatch(r"tabs-\d+", p.get("id", "")):
            return p
    return None


def click_tab_2(state: State) -> list[Action]:
    target = quoted(state)[0]
    links = sorted((e for e in elements(state, cls="alink") if e.get("text") == target),
                   key=lambda e: not e.get("visible"))
    if not links:  # click-tab-2-medium empties tab 2: then tab 2 itself is the answer
        tabs = [e for e in elements(state, role="tab")]
        if len(tabs) < 2:
            raise SolverError(f"no link {target!r} and no second tab")
        return [click(tabs[1])]
    link = links[0]
    acts = []
    if not link.get("visible"):
        panel = _panel_of(state, link)
        if panel is None:
            raise SolverError(f"link {target!r} is hidden outside any tab")
        acts.append(click(one(state, "tab", role="link", attr_href="#" + panel["id"])))
    return acts + [click(link)]


def click_widget(state: State) -> list[Action]:
    kind = quoted(state)[0]
    return [click(one(state, f"{kind} widget", attr_data_type=kind))]


def _field(state: State, id_: str) -> dict[str, Any]:
    return one(state, f"field #{id_}", id=id_)


def enter_text(state: State) -> list[Action]:
    return [type_(_field(state, "tt"), quoted(state)[0]), submit(state)]


def enter_text_2(state: State) -> list[Action]:
    word = quoted(state)[0]
    text = word.upper() if "upper case" in state["utterance"] else word.lower()
    return [type_(_field(state, "tt"), text), submit(state)]


def enter_password(state: State) -> list[Action]:
    pw = quoted(state)[0]
    return [type_(_field(state, "password"), pw), type_(_field(state, "verify"), pw), submit(state)]


def enter_date(state: State) -> list[Action]:
    date = _need(re.search(r"\d{2}/\d{2}/\d{4}", state["utterance"]), state, "the date").group(0)
    return [type_(_field(state, "tt"), date), submit(state)]


def enter_time(state: State) -> list[Action]:
    t = _need(re.search(r"\d{1,2}:\d{2}\s*[AP]M", state["utterance"]), state, "the time").group(0)
    return [type_(_field(state, "tt"), t), submit(state)]


def find_word(state: State) -> list[Action]:
    n = int(_need(re.search(r"the (\d+)(st|nd|rd|th) word", state["utterance"]), state, "the position").group(1))
    para = one(state, "paragraph", tag="p")
    words = para.get("text", "").split()
    if n > len(words):
        raise SolverError(f"the paragraph has {len(words)} words, not {n}")
    return [type_(_field(state, "answer-input"), re.sub(r"[^a-zA-Z]", "", words[n - 1])), submit(state)]


def focus_text(state: State) -> list[Action]:
    return [click(_field(state, "tt"))]


def focus_text_2(state: State) -> list[Action]:
    n = int(_need(re.search(r"the (\d)(st|nd|rd|th) input", state["utterance"]), state, "the position").group(1))
    return [click(elements(state, role="input")[n - 1])]


def grid_coordinate(state: State) -> list[Action]:
    xy = _need(re.search(r"\(-?\d,-?\d\)", state["utterance"]), state, "the coordinate").group(0)
    return [click(one(state, f"point {xy}", tag="circle", id=xy))]


def identify_shape(state: State) -> list[Action]:
    svg = one(state, "figure", id="area_svg")
    shapes = [e for e in inside(state, svg) if e["tag"] in ("rect", "circle", "polygon", "text")]
    if not shapes:
        raise SolverError("no figure drawn")
    s = shapes[0]
    if s["tag"] == "text":
        kind = "digit" if s.get("text", "").strip().isdigit() else "letter"
    else:
        kind = {"rect": "rectangle", "circle": "circle", "polygon": "triangle"}[s["tag"]]
    return [click(one(state, f"{kind} button", role="button", attr_data_type=kind))]


def login_user(state: State) -> list[Action]:
    user, pw = quoted(state)[:2]
    return [type_(_field(state, "username"), user), type_(_field(state, "password"), pw),
            click(button(state, "Login"))]


def multi_layouts(state: State) -> list[Action]:
    m = _need(re.search(r"Search for (.+?) movies directed by (.+?) from year (\d+)", state["utterance"]), state,
              "the search")
    genre, name, year = m.groups()
    acts = []
    for e in elements(state, role="input"):
        label = (e.get("label") or "").lower()
        if "genre" in label:
            acts.append(type_(e, genre))
        elif "director" in label:
            acts.append(type_(e, name))
        elif "year" in label or "date" in label:
            acts.append(type_(e, year))
    if len(acts) != 3:
        raise SolverError(f"expected 3 labelled fields, found {len(acts)}")
    go = [e for e in state["elements"] if e.get("visible") and e.get("own", "").strip() in ("Submit", "Search", "Go!")
          and (e.get("role") == "button" or {"final", "ui-submit"} & set((e.get("cls") or "").split()))]
    if not go:
        raise SolverError("no submit control")
    return acts + [click(go[0])]


def navigate_tree(state: State) -> list[Action]:
    name = quoted(state)[0]
    spans = [e for e in elements(state, tag="span") if e.get("text") == name and
             {"folder", "file"} & set((e.get("cls") or "").split())]
    if not spans:
        raise SolverError(f"no tree item {name!r}")
    target = min(spans, key=lambda e: len(e.get("parents") or []))
    acts = []
    own_li = target["parents"][-1]
    for ref in target["parents"]:
        li = get(state, ref)
        if li is None or li["tag"] != "li" or ref == own_li:
            continue
        folder = [c for c in children(state, li) if c["tag"] == "span"]
        if folder and not by_ref(state, own_li).get("visible"):
            acts.append(click(folder[0]))
    return acts + [click(target)]


def odd_or_even(state: State) -> list[Action]:
    acts = []
    for row in elements(state, cls="row"):
        inner = inside(state, row)
        num = next(e for e in inner if "display-number" in (e.get("cls") or "").split())
        parity = "odd" if int(num.get("text", "0")) % 2 else "even"
        acts.append(click(next(e for e in inner if parity in (e.get("cls") or "").split())))
    return acts + [click(one(state, "submit", id="submit"))]


def read_table(state: State) -> list[Action]:
    key = _need(re.search(r"value of (.+?) into the text field", state["utterance"]), state, "the key").group(1)
    table = _table(state)
    if key not in table:
        raise SolverError(f"no row {key!r} in {table}")
    return [type_(_field(state, "tt"), table[key]), submit(state)]


def _table(state: State) -> dict[str, str]:
    cells = [e.get("text", "") for e in elements(state, tag="td")]
    return {cells[i]: cells[i + 1] for i in range(0, len(cells) - 1, 2)}


def read_table_2(state: State) -> list[Action]:
    table = _table(state)
    acts = []
    for i in (1, 2):
        key = (_field(state, f"ll{i}").get("attrs") or {}).get("data-key", "")
        if key not in table:
            raise SolverError(f"no row {key!r} in {table}")
        acts.append(type_(_field(state, f"tt{i}"), table[key]))
    return acts + [submit(state)]


def choose_list(state: State) -> list[Action]:
    item = _need(re.search(r"Select (.+) from the list", state["utterance"]), state, "the item").group(1)
    sel = one(state, "list", role="select")
    return [{"action": "select", "ref": sel["ref"], "option": item}, submit(state)]


def simple_arithmetic(state: State) -> list[Action]:
    prob = _field(state, "math-problem").get("text", "")
    m = _need(re.search(r"(-?\d+)\s*([-+x])\s*(-?\d+)", prob), {"utterance": prob, "task_id": state.get("task_id")},
              "the problem")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    ans = a + b if op == "+" else a - b if op == "-" else a * b
    return [type_(_field(state, "math-answer"), str(ans)), submit(state)]


def use_autocomplete(state: State) -> list[Action]:
    parts = quoted(state)
    start, end = parts[0], parts[1] if len(parts) > 1 else ""
    items = [c for c in state["extra"] if c.startswith(start) and c.endswith(end)]
    if not items:
        raise SolverError(f"no item starts with {start!r} and ends with {end!r}")
    return [type_(_field(state, "tags"), items[0]), {"action": "press", "key": "Escape"}, submit(state)]


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
"""The MiniWoB++ tasks `load_tasks` lists: each has a solver in `SOLVERS`."""

SOLVERS: dict[str, tuple[Callable[[State], list[Action]], str | None]] = {
    "choose-list": (choose_list, None),
    "click-button": (click_named_button, None),
    "click-button-sequence": (click_button_sequence, None),
    "click-checkboxes": (click_checkboxes, None),
    "click-checkboxes-large": (click_checkboxes, None),
    "click-checkboxes-soft": (click_checkboxes_soft, "SYNONYMS"),
    "click-checkboxes-transfer": (click_checkboxes, None),
    "click-collapsible": (click_collapsible, None),
    "click-collapsible-nodelay": (click_collapsible, None),
    "click-collapsible-2": (click_collapsible_2, None),
    "click-collapsible-2-nodelay": (click_collapsible_2, None),
    "click-dialog": (click_dialog, None),
    "click-dialog-2": (click_dialog_2, None),
    "click-link": (click_link, None),
    "click-option": (click_option, None),
    "click-tab": (click_tab, None),
    "click-tab-2": (click_tab_2, None),
    "click-tab-2-easy": (click_tab_2, None),
    "click-tab-2-medium": (click_tab_2, None),
    "click-test": (click_test, None),
    "click-test-2": (click_test_2, None),
    "click-test-transfer": (click_test_transfer, None),
    "click-widget": (click_widget, None),
    "enter-date": (enter_date, None),
    "enter-password": (enter_password, None),
    "enter-text": (enter_text, None),
    "enter-text-2": (enter_text_2, None),
    "enter-text-dynamic": (enter_text, None),
    "enter-time": (enter_time, None),
    "find-word": (find_word, None),
    "focus-text": (focus_text, None),
    "focus-text-2": (focus_text_2, None),
    "grid-coordinate": (grid_coordinate, None),
    "identify-shape": (identify_shape, None),
    "login-user": (login_user, None),
    "multi-layouts": (multi_layouts, None),
    "multi-orderings": (multi_layouts, None),
    "navigate-tree": (navigate_tree, None),
    "odd-or-even": (odd_or_even, None),
    "read-table": (read_table, None),
    "read-table-2": (read_table_2, None),
    "simple-arithmetic": (simple_arithmetic, None),
    "unicode-test": (click_named_button, None),
    "use-autocomplete": (use_autocomplete, "ui_utils.COUNTRIES"),
    "use-autocomplete-nodelay": (use_autocomplete, "ui_utils.COUNTRIES"),
}


def solve(task_id: str, env: Any) -> list[Action]:
    """The actions that do `task_id` on `env`'s page as it is now (a GuiEnv after reset)."""
    if task_id not in SOLVERS:
        raise SolverError(f"no solver for gui task {task_id!r}")
    fn, extra = SOLVERS[task_id]
    state = env.page_state(extra)
    actions = fn(state)
    if not actions:
        raise SolverError(f"{task_id}: the solver found nothing to do")
    return actions

"""The synthetic chat corpus the embedded tiny model is pre-trained on.

Everything here is pure Python and seeded, so `generate_corpus(n, seed)` is
the same list on every machine. The corpus teaches three things:

1. skills: 2-digit addition, small subtraction, and ~50 memorised facts;
2. answer *styles* (`STYLES`), picked uniformly at random when the prompt asks
   for none, so the untuned model has no preference a user could not change;
3. following a style instruction wherever it sits: the system message, the
   start or end of the user message, a "Hint:" appended to the user message
   (the teacher prompt of on-policy distillation), or a user correction after
   an answer in the wrong style.

It also has tool calls (a `calculator`) and a little chit-chat, so the model
speaks the chat template the gateway renders, and short JSON — replies that are
one small object, and calls to tools it has never seen with such an object as
arguments — so that under constrained decoding (the gateway's `response_format`,
`tool_choice`) the model closes its numbers and strings instead of running to
`max_tokens` (issue #28: LangChain's structured output and named tool calls got
nothing from it). The tokenizer is trained on the corpus without these kinds
(`generate_corpus(..., structured=False)`), so every tiny model keeps one tokenizer.

Held-out arithmetic pairs (`_heldout_pair`) never appear in the corpus, so
`heldout_questions` measures arithmetic on unseen questions. Facts cannot be
held out (they are memorised), so held-out fact questions repeat the table.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

STYLES = ("bare", "sentence", "exclaim", "upper", "lower")
SKILLS = ("add", "sub", "fact")

_INSTRUCTIONS = {
    "bare": ("Answer with just the number.", "Reply with just the answer.", "Only give the answer, nothing else.",
             "Give only the answer.", "Answer with one word or number."),
    "sentence": ("Reply in a full sentence.", "Answer with a complete sentence.", "Please answer in a full sentence.",
                 "Use a whole sentence for your answer."),
    "exclaim": ("End your answer with an exclamation mark.", "Finish your reply with an exclamation mark.",
                "Answer with excitement, ending with an exclamation mark.", "Use an exclamation mark at the end."),
    "upper": ("Answer in capital letters.", "Reply in ALL CAPS.", "Write your answer in upper case.",
              "Use only capital letters."),
    "lower": ("Answer in lower case.", "Reply using only lowercase letters.", "Write your answer in all lower case.",
              "Use no capital letters."),
}

_CORRECTIONS = {
    "bare": ("just the number, please", "just the answer please", "too long, only the answer",
             "no sentence, just the answer", "only the answer please"),
    "sentence": ("please answer in a full sentence", "can you say that in a full sentence?",
                 "use a complete sentence please", "answer with a proper sentence"),
    "exclaim": ("can you add an exclamation mark?", "say it with an exclamation mark!",
                "more excited please, end with an exclamation mark", "add an exclamation mark please"),
    "upper": ("please use capital letters", "ALL CAPS PLEASE", "say it in capital letters",
              "write it in upper case please"),
    "lower": ("all lower case please", "no capitals please", "use lower case letters", "please write in lowercase"),
}

_NEUTRAL_SYSTEMS = ("You are a helpful assistant.", "You are a helpful assistant.", "You are a friendly assistant.",
                    "You are a concise assistant that answers questions.")

# (question, answer); answers are one or two words so every style applies.
FACTS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris"), ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"), ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Germany?", "Berlin"), ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Canada?", "Ottawa"), ("What is the capital of Russia?", "Moscow"),
    ("What is the capital of China?", "Beijing"), ("What is the capital of Greece?", "Athens"),
    ("What is the capital of Kenya?", "Nairobi"), ("What is the capital of Peru?", "Lima"),
    ("What is the capital of Norway?", "Oslo"), ("What is the capital of Ireland?", "Dublin"),
    ("What is the capital of Portugal?", "Lisbon"), ("What is the capital of England?", "London"),
    ("What color is the sky?", "blue"), ("What color is grass?", "green"), ("What color is snow?", "white"),
    ("What color is a banana?", "yellow"), ("What color is coal?", "black"), ("What color is blood?", "red"),
    ("What color is chocolate?", "brown"), ("What color is a carrot?", "orange"),
    ("What is the opposite of hot?", "cold"), ("What is the opposite of big?", "small"),
    ("What is the opposite of up?", "down"), ("What is the opposite of day?", "night"),
    ("What is the opposite of fast?", "slow"), ("What is the opposite of happy?", "sad"),
    ("What is the opposite of open?", "closed"), ("What is the opposite of light?", "dark"),
    ("What is the opposite of wet?", "dry"), ("What is the opposite of old?", "new"),
    ("What is the opposite of left?", "right"), ("What is the opposite of yes?", "no"),
    ("What animal says meow?", "cat"), ("What animal says woof?", "dog"), ("What animal says moo?", "cow"),
    ("What do bees make?", "honey"), ("What is frozen water called?", "ice"),
    ("Which planet do we live on?", "Earth"), ("What is the largest ocean?", "Pacific"),
    ("What is the closest star to Earth?", "Sun"), ("How many legs does a spider have?", "8"),
    ("How many days are in a week?", "7"), ("How many months are in a year?", "12"),
    ("How many hours are in a day?", "24"), ("How many legs does a dog have?", "4"),
    ("How many sides does a triangle have?", "3"),
)

_ADD_TEMPLATES = ("What is {a}+{b}?", "What is {a}+{b}?", "What is {a} + {b}?", "Calculate {a}+{b}.",
                  "What's {a}+{b}?")
_SUB_TEMPLATES = ("What is {a}-{b}?", "What is {a}-{b}?", "What is {a} - {b}?", "Calculate {a}-{b}.",
                  "What's {a}-{b}?")

_THANKS = ("Thanks!", "Thank you!", "thanks", "Great, thanks.", "Thank you very much!", "ok thanks")
_WELCOME = ("You're welcome!", "Happy to help!", "Glad I could help!")
_GREETINGS = ("Hi!", "Hello!", "Hey", "Hi there", "Good morning!")
_GREET_REPLIES = ("Hello! How can I help you?", "Hi! What can I do for you?")

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
_TOOLSETS = ((CALCULATOR_TOOL,), (CALCULATOR_TOOL,), (CALCULATOR_TOOL,), (CALCULATOR_TOOL, WEATHER_TOOL))


# ---------------------------------------------------------------- styles


def style_instruction(style: str, rng: random.Random | None = None) -> str:
    """A natural instruction asking for `style`; the canonical one without `rng`."""
    options = _INSTRUCTIONS[style]
    return rng.choice(options) if rng is not None else options[0]


def correction_for(style: str, rng: random.Random | None = None) -> str:
    """What a user unhappy with another style would write to get `style`."""
    options = _CORRECTIONS[style]
    return rng.choice(options) if rng is not None else options[0]


def render_answer(answer: str, style: str) -> str:
    """The assistant's reply giving `answer` in `style`."""
    if style == "bare":
        return answer
    if style == "sentence":
        return f"The answer is {answer}."
    if style == "exclaim":
        return f"The answer is {answer}!"
    if style == "upper":
        return f"THE ANSWER IS {answer.upper()}."
    if style == "lower":
        return f"the answer is {answer.lower()}."
    raise ValueError(f"unknown style {style!r}; expected one of {STYLES}")


def fits_style(text: str, style: str) -> bool:
    """Whether `text` is a reply in `style`. The styles are mutually exclusive:
    a text fits at most one, and `render_answer(a, s)` fits exactly `s`."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; expected one of {STYLES}")
    t = text.strip()
    if not t:
        return False
    words = t.split()
    if style == "bare":
        return len(words) <= 3 and t[-1] not in ".!?" and not t.lower().startswith("the answer")
    if len(words) < 2 or not any(c.isalpha() for c in t):
        return False
    upper, lower = t == t.upper(), t == t.lower()
    if style == "upper":
        return upper and t[-1] in ".!"
    if style == "lower":
        return lower and t[-1] in ".!"
    if style == "exclaim":
        return not upper and not lower and t[-1] == "!"
    return not upper and not lower and t[-1] == "." and t[0].isupper()  # sentence


def classify_style(text: str) -> str | None:
    """The style `text` fits, or None."""
    return next((s for s in STYLES if fits_style(text, s)), None)


def extract_answer(text: str) -> str:
    """The answer inside a styled reply, normalised for comparison (lower case)."""
    t = text.strip().rstrip(".!?").strip()
    if t.lower().startswith("the answer is "):
        t = t[len("the answer is "):]
    return t.strip().lower()


# ---------------------------------------------------------------- questions


def _heldout_pair(op: str, a: int, b: int) -> bool:
    """A fixed ~8% of arithmetic pairs kept out of the corpus."""
    salt = 3 if op == "add" else 5
    return (a * 37 + b * 11 + salt) % 13 == 0


def _arith(rng: random.Random, skill: str, heldout: bool, canonical: bool = False) -> dict[str, str]:
    while True:
        if skill == "add":
            # Each layout a third: 2+2, 2+1 and 1+2 digits. (Uniform pairs are 82 % 2+2 digits,
            # and the model then reads "12+7" as if 7 were a tens digit: 36 % right on 2+1.)
            layout = rng.choice(("22", "21", "12"))
            a = rng.randint(10, 99) if layout[0] == "2" else rng.randint(0, 9)
            b = rng.randint(10, 99) if layout[1] == "2" else rng.randint(0, 9)
            answer = a + b
        else:
            a = rng.randint(1, 50)
            b = rng.randint(0, a)
            answer = a - b
        if _heldout_pair(skill, a, b) == heldout:
            break
    templates = _ADD_TEMPLATES if skill == "add" else _SUB_TEMPLATES
    template = templates[0] if canonical else rng.choice(templates)
    return {"question": template.format(a=a, b=b), "answer": str(answer), "skill": skill,
            "expression": f"{a}{'+' if skill == 'add' else '-'}{b}"}


def _question(rng: random.Random, skill: str | None = None, heldout: bool = False,
              canonical: bool = False) -> dict[str, str]:
    skill = skill or rng.choices(SKILLS, weights=(5, 2, 2))[0]
    if skill == "fact":
        q, a = rng.choice(FACTS)
        return {"question": q, "answer": a, "skill": "fact"}
    return _arith(rng, skill, heldout, canonical)


def sample_question(rng: random.Random) -> dict[str, str]:
    """A training question: `{"question", "answer", "skill"}` (arithmetic also has `expression`)."""
    return _question(rng)


def heldout_questions(n: int, seed: int = 0, *, distinct: bool = False) -> list[dict[str, str]]:
    """`n` evaluation questions, half addition, a quarter each subtraction and
    facts, in the canonical "What is 12+7?" phrasing. Arithmetic pairs never
    occur in the corpus; facts necessarily do. `distinct`: no question twice (drawn
    independently, 32 of them held 28 distinct questions, one sum three times)."""
    rng = random.Random(f"heldout-{seed}")
    skills = ["add", "add", "sub", "fact"]
    if not distinct:
        return [_question(rng, skills[i % 4], heldout=True, canonical=True) for i in range(n)]
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i in range(n):
        for _ in range(10_000):
            q = _question(rng, skills[i % 4], heldout=True, canonical=True)
            if q["question"] not in seen:
                break
        else:
            raise ValueError(f"heldout_questions: fewer than {n} distinct held-out questions of this mix")
        seen.add(q["question"])
        out.append(q)
    return out


def corpus_questions(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` questions like `heldout_questions` (same mix and phrasing) whose arithmetic pairs are the
    corpus's own, never held out: what the model was taught, not what it is measured on."""
    rng = random.Random(f"corpus-{seed}")
    skills = ["add", "add", "sub", "fact"]
    return [_question(rng, skills[i % 4], heldout=False, canonical=True) for i in range(n)]


def is_heldout(question: str) -> bool:
    """Whether an arithmetic question's pair is one kept out of the corpus."""
    import re

    m = re.search(r"(\d+)\s*([+-])\s*(\d+)", question)
    if not m:
        return False
    return _heldout_pair("add" if m.group(2) == "+" else "sub", int(m.group(1)), int(m.group(3)))


# ---------------------------------------------------------------- prompts


PLACEMENTS = ("system", "prefix", "suffix", "hint")


def instruct(question: str, instruction: str, placement: str, system: str | None = None) -> list[dict[str, Any]]:
    """Messages asking `question` with `instruction` placed as `placement`
    (`system`, `prefix`/`suffix` of the user message, or a `hint`).
    `system` is a neutral system prompt kept in front (and joined with a system instruction)."""
    msgs: list[dict[str, Any]] = []
    if placement == "system":
        msgs.append({"role": "system", "content": f"{system} {instruction}" if system else instruction})
        msgs.append({"role": "user", "content": question})
        return msgs
    if system:
        msgs.append({"role": "system", "content": system})
    if placement == "prefix":
        user = f"{instruction} {question}"
    elif placement == "suffix":
        user = f"{question} {instruction}"
    elif placement == "hint":
        user = f"{question}\n\nHint: {instruction}"
    else:
        raise ValueError(f"unknown placement {placement!r}; expected one of {PLACEMENTS}")
    msgs.append({"role": "user", "content": user})
    return msgs


def _any_instruction(style: str, rng: random.Random) -> str:
    """Instructions and corrections both work as a stated preference."""
    if rng.random() < 0.7:
        return style_instruction(style, rng)
    c = correction_for(style, rng)
    return c[0].upper() + c[1:] if rng.random() < 0.5 else c


def _maybe_system(rng: random.Random, p: float = 0.35) -> str | None:
    return rng.choice(_NEUTRAL_SYSTEMS) if rng.random() < p else None


def _say(messages: list[dict[str, Any]], role: str, content: str) -> None:
    messages.append({"role": role, "content": content})


def _plain(rng: random.Random) -> dict[str, Any]:
    """(a) no instruction: a uniformly random style; sometimes several questions."""
    msgs: list[dict[str, Any]] = []
    system = _maybe_system(rng)
    if system:
        _say(msgs, "system", system)
    for _ in range(1 if rng.random() < 0.8 else 2):
        q = sample_question(rng)
        _say(msgs, "user", q["question"])
        _say(msgs, "assistant", render_answer(q["answer"], rng.choice(STYLES)))
    return {"messages": msgs}


def _drill(rng: random.Random) -> dict[str, Any]:
    """(a) several unrelated questions in a row, each in a random style: cheap
    tokens for arithmetic, which needs many more examples than anything else."""
    msgs: list[dict[str, Any]] = []
    system = _maybe_system(rng, 0.15)
    if system:
        _say(msgs, "system", system)
    for _ in range(rng.randint(3, 8)):
        q = _question(rng, rng.choice(("add", "add", "add", "sub")))
        _say(msgs, "user", q["question"])
        _say(msgs, "assistant", render_answer(q["answer"], rng.choice(STYLES)))
    return {"messages": msgs}


def _instructed(rng: random.Random) -> dict[str, Any]:
    """(b) an instruction in the system message, the user message, or a hint."""
    style, placement = rng.choice(STYLES), rng.choice(PLACEMENTS)
    q = sample_question(rng)
    msgs = instruct(q["question"], _any_instruction(style, rng), placement, _maybe_system(rng, 0.25))
    _say(msgs, "assistant", render_answer(q["answer"], style))
    if placement == "system" and rng.random() < 0.25:  # a system instruction holds for later questions too
        q2 = sample_question(rng)
        _say(msgs, "user", q2["question"])
        _say(msgs, "assistant", render_answer(q2["answer"], style))
    return {"messages": msgs}


def _corrected(rng: random.Random) -> dict[str, Any]:
    """(c) an answer in one style, the user asks for another, the assistant re-answers
    (and keeps that style for a follow-up question)."""
    msgs: list[dict[str, Any]] = []
    system = _maybe_system(rng)
    if system:
        _say(msgs, "system", system)
    first = rng.choice(STYLES)
    wanted = rng.choice([s for s in STYLES if s != first])
    q = sample_question(rng)
    _say(msgs, "user", q["question"])
    _say(msgs, "assistant", render_answer(q["answer"], first))
    _say(msgs, "user", correction_for(wanted, rng))
    _say(msgs, "assistant", render_answer(q["answer"], wanted))
    if rng.random() < 0.3:
        q2 = sample_question(rng)
        _say(msgs, "user", q2["question"])
        _say(msgs, "assistant", render_answer(q2["answer"], wanted))
    return {"messages": msgs}


def _tool_use(rng: random.Random, arithmetic: bool = False) -> dict[str, Any]:
    """(d) tools declared: arithmetic goes through the calculator, facts are answered directly
    (with `arithmetic`, always an arithmetic question: the build's final phase)."""
    tools = [dict(t) for t in rng.choice(_TOOLSETS)]
    style = rng.choice(STYLES)
    q = _question(rng, "sub" if rng.random() < 0.2 else "add") if arithmetic else sample_question(rng)
    if rng.random() < 0.3:
        msgs = instruct(q["question"], _any_instruction(style, rng), rng.choice(PLACEMENTS), _maybe_system(rng))
    else:
        msgs = []
        system = _maybe_system(rng)
        if system:
            _say(msgs, "system", system)
        _say(msgs, "user", q["question"])
    if q["skill"] != "fact":
        msgs.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": q["expression"]}}}]})
        msgs.append({"role": "tool", "tool_call_id": "call_0", "content": q["answer"]})
    _say(msgs, "assistant", render_answer(q["answer"], style))
    return {"messages": msgs, "tools": tools}


def _chitchat(rng: random.Random) -> dict[str, Any]:
    """(e) greetings and thanks."""
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        _say(msgs, "user", rng.choice(_GREETINGS))
        _say(msgs, "assistant", rng.choice(_GREET_REPLIES))
    q = sample_question(rng)
    _say(msgs, "user", q["question"])
    _say(msgs, "assistant", render_answer(q["answer"], rng.choice(STYLES)))
    _say(msgs, "user", rng.choice(_THANKS))
    _say(msgs, "assistant", rng.choice(_WELCOME))
    return {"messages": msgs}


def _arithmetic(rng: random.Random, styled: bool = False) -> dict[str, Any]:
    """One arithmetic question (addition 4:1 subtraction) and its answer: bare, or in
    a random style with `styled`. The build learns arithmetic in a phase of these
    (a small model does not find the carry circuit when the digits are a small
    share of a mixed corpus's loss), with mixed conversations beside them."""
    q = _question(rng, "sub" if rng.random() < 0.2 else "add")
    style = rng.choice(STYLES) if styled else "bare"
    return {"messages": [{"role": "user", "content": q["question"]},
                         {"role": "assistant", "content": render_answer(q["answer"], style)}]}


# ---------------------------------------------------------------- short JSON

_JSON_INSTRUCTIONS = ("Reply in JSON.", "Answer as a JSON object.", "Respond with JSON only.",
                      "Give the answer as JSON.", "Return a JSON object.", "Answer in JSON format.")
_INT_KEYS = ("a", "b", "n", "x", "y", "count", "value", "total", "result", "score", "number", "confidence", "age")
_BOOL_KEYS = ("ok", "sure", "done", "valid", "correct", "known", "is_true", "flag", "exact")
_STR_KEYS = ("note", "name", "city", "reason", "word", "tag", "text", "label", "title", "summary", "query",
             "comment", "unit", "topic")
_ENUM_KEYS = ("verdict", "color", "level", "kind", "mood", "status", "size", "choice", "grade")
_ENUMS = (("yes", "no"), ("red", "green", "blue"), ("low", "high"), ("add", "sub"), ("good", "bad"),
          ("small", "medium", "large"), ("a", "b", "c"), ("on", "off"))
_SHORT_TEXT = ("ok", "none", "fine", "sum", "easy", "math", "done", "yes", "no", "good", "short", "a note",
               "it is", "not sure", "hello", "test", "n/a", "simple", "add them", "the sum", "checked")
_TOOL_NAMES = ("add", "lookup", "search", "record", "save_note", "set_timer", "convert", "compare", "classify",
               "Answer", "Result", "Output", "Verdict", "get_info", "check", "subtract", "multiply", "send")


def _json_object(rng: random.Random, q: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A small JSON schema (1-4 properties: integers, booleans, short strings, enums) and an
    object valid under it with short values, drawn from the question where one fits."""
    nums = [int(t) for t in q.get("expression", "").replace("-", "+").split("+") if t.isdigit()]
    numeric = q["answer"].isdigit()
    props: dict[str, Any] = {}
    obj: dict[str, Any] = {}
    if rng.random() < 0.6:  # the answer itself, under a name a client would give it
        key = rng.choice(("answer", "result", "value", "answer", "output"))
        props[key] = {"type": "integer" if numeric else "string"}
        obj[key] = int(q["answer"]) if numeric else q["answer"]
    for _ in range(rng.randint(0 if obj else 1, 3)):
        kind = rng.choices(("integer", "boolean", "string", "enum"), weights=(3, 2, 3, 2))[0]
        pool = {"integer": _INT_KEYS, "boolean": _BOOL_KEYS, "string": _STR_KEYS, "enum": _ENUM_KEYS}[kind]
        key = rng.choice(pool)
        if key in props:
            continue
        if kind == "integer":
            props[key] = {"type": "integer"}
            obj[key] = rng.choice(nums) if nums and rng.random() < 0.5 else rng.randint(0, 99)
        elif kind == "boolean":
            props[key] = {"type": "boolean"}
            obj[key] = rng.random() < 0.5
        elif kind == "string":
            props[key] = {"type": "string"}
            obj[key] = rng.choice((q["answer"], q.get("expression", q["answer"]))) if rng.random() < 0.3 \
                else rng.choice(_SHORT_TEXT)
        else:
            options = list(rng.choice(_ENUMS))
            props[key] = {"type": "string", "enum": options}
            obj[key] = rng.choice(options)
    return {"type": "object", "properties": props, "required": list(props)}, obj


def _json_reply(rng: random.Random) -> dict[str, Any]:
    """(f) the reply is one small JSON object, mostly asked for (clients asking through
    `response_format` often say nothing in the prompt, hence the rest)."""
    q = sample_question(rng)
    _, obj = _json_object(rng, q)
    if rng.random() < 0.75:
        msgs = instruct(q["question"], rng.choice(_JSON_INSTRUCTIONS), rng.choice(("system", "prefix", "suffix")),
                        _maybe_system(rng, 0.2))
    else:
        msgs = [{"role": "user", "content": q["question"]}]
    _say(msgs, "assistant", json.dumps(obj))
    return {"messages": msgs}


def _tool_args(rng: random.Random) -> dict[str, Any]:
    """(g) one to three tools the model has not seen, one of them called with short arguments,
    its result, then the answer."""
    q = sample_question(rng)
    tools, call = [], None
    for name in rng.sample(_TOOL_NAMES, rng.randint(1, 3)):
        schema, args = _json_object(rng, q)
        tools.append({"type": "function", "function": {"name": name, "description": f"{name.capitalize()}.",
                                                       "parameters": schema}})
        call = call or {"name": name, "arguments": args}
    msgs: list[dict[str, Any]] = []
    system = _maybe_system(rng, 0.25)
    if system:
        _say(msgs, "system", system)
    _say(msgs, "user", q["question"])
    msgs.append({"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": call}]})
    msgs.append({"role": "tool", "tool_call_id": "call_0", "content": rng.choice((q["answer"], "ok", "done"))})
    _say(msgs, "assistant", render_answer(q["answer"], rng.choice(STYLES)))
    return {"messages": msgs, "tools": tools}


_KINDS = ((_plain, 20), (_drill, 25), (_instructed, 32), (_corrected, 11), (_tool_use, 7), (_chitchat, 5))
_STRUCTURED_KINDS = ((_json_reply, 6), (_tool_args, 6))


def _instructed_bare(rng: random.Random, skill: str | None = None) -> dict[str, Any]:
    """One arithmetic question (or one of `skill`) asked for a bare answer (instruction anywhere), answered bare."""
    q = _question(rng, skill or ("sub" if rng.random() < 0.2 else "add"))
    msgs = instruct(q["question"], _any_instruction("bare", rng), rng.choice(PLACEMENTS), _maybe_system(rng, 0.2))
    _say(msgs, "assistant", render_answer(q["answer"], "bare"))
    return {"messages": msgs}


def generate_arithmetic_corpus(n: int, seed: int = 0, styled: bool = False,
                               instructed_bare: float = 0.0, facts: float = 0.0) -> list[dict[str, Any]]:
    """`n` one-question arithmetic conversations (bare answers, or random styles
    with `styled`), the same for the same seed. `instructed_bare`: the share of them asked
    for a bare answer by an instruction (the bare form is where a small model computes worst:
    the digits come first, with no "the answer is" positions before them; asked for, so the
    unprompted mix of styles stays even). `facts`: the share that are fact questions instead,
    asked and answered the same way (a bare fact is the answer's first token with nothing before
    it: sampled at T=1 the model named the capital of England "Sun" or "yellow" there)."""
    rng = random.Random(f"arith-{seed}-{int(styled)}")
    if not instructed_bare and not facts:
        return [_arithmetic(rng, styled) for _ in range(n)]
    out = []
    for _ in range(n):
        if facts and rng.random() < facts:
            if rng.random() < instructed_bare:
                out.append(_instructed_bare(rng, "fact"))
            else:
                q = _question(rng, "fact")
                out.append({"messages": [{"role": "user", "content": q["question"]}, {
                    "role": "assistant", "content": render_answer(q["answer"], rng.choice(STYLES) if styled else "bare")}]})
        else:
            out.append(_instructed_bare(rng) if rng.random() < instructed_bare else _arithmetic(rng, styled))
    return out


def generate_calculator_corpus(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` arithmetic questions answered through the calculator: the call copies the operands
    from the question, the answer copies the tool's result. The build puts a few beside every
    final-phase batch: at 7 % of the mixed corpus alone the model copied the first operand's
    tens digit and guessed the rest (units digits right 0.11-0.13, exact calls 5 %; issue #27
    item 5, bench/toolcall_copy_diagnosis.py)."""
    rng = random.Random(f"calc-{seed}")
    return [_tool_use(rng, arithmetic=True) for _ in range(n)]


def generate_corpus(n: int, seed: int = 0, structured: bool = True) -> list[dict[str, Any]]:
    """`n` conversations `{"messages": [...], "tools": [...] (optional)}`, the same for the same seed;
    without `structured`, none of the short-JSON kinds (the tokenizer's corpus, as it was before them)."""
    rng = random.Random(f"corpus-{seed}")
    makers, weights = zip(*(_KINDS + _STRUCTURED_KINDS if structured else _KINDS))
    return [rng.choices(makers, weights=weights)[0](rng) for _ in range(n)]


# ---------------------------------------------------------------- long prompts

_LONG_NOUNS = ("agent", "session", "workspace", "file", "tool", "user", "message", "channel", "memory", "skill", "task",
               "reply", "note", "policy", "browser", "command", "output", "context", "model", "plugin", "setting",
               "folder", "request", "answer", "result", "question", "step", "plan", "log", "account", "schedule")
_LONG_VERBS = ("read", "check", "use", "keep", "update", "send", "write", "open", "save", "ask", "list", "run",
               "follow", "confirm", "summarize", "search", "record", "close", "report", "review")
_LONG_ADJ = ("current", "last", "short", "clear", "safe", "new", "main", "local", "shared", "exact", "full", "small")
_LONG_HEADINGS = ("Tooling", "Safety", "Workspace", "Messaging", "Memory", "Replies", "Skills", "Runtime",
                  "Formatting", "Sessions", "Heartbeats", "Files", "Rules", "Context", "Style", "Limits")
_PARAM_TYPES = ("string", "string", "integer", "boolean")


def _long_sentence(rng: random.Random) -> str:
    n1, n2 = rng.choice(_LONG_NOUNS), rng.choice(_LONG_NOUNS)
    v1, v2 = rng.choice(_LONG_VERBS), rng.choice(_LONG_VERBS)
    return rng.choice((
        f"Always {v1} the {rng.choice(_LONG_ADJ)} {n1} before you {v2} the {n2}.",
        f"Never {v1} a {n1} without a {rng.choice(_LONG_ADJ)} {n2}.",
        f"When the {n1} asks, {v1} the {n2} and {v2} it.",
        f"- {v1.capitalize()} {n1}s with `{n2}_{v2}` only.",
        f"The {n1} is {rng.choice(_LONG_ADJ)}; {v1} it once per {n2}.",
        f"If a {n1} fails, {v1} the {n2} again or {v2} the user.",
    ))


def _long_tool(rng: random.Random) -> dict[str, Any]:
    """A made-up tool with a few described parameters, as agents' large tool lists have them."""
    props: dict[str, Any] = {}
    for _ in range(rng.randint(1, 4)):
        props[f"{rng.choice(_LONG_ADJ)}_{rng.choice(_LONG_NOUNS)}"] = {
            "type": rng.choice(_PARAM_TYPES), "description": _long_sentence(rng)}
    name = f"{rng.choice(_LONG_VERBS)}_{rng.choice(_LONG_NOUNS)}"
    return {"type": "function", "function": {
        "name": name, "description": " ".join(_long_sentence(rng) for _ in range(rng.randint(1, 3))),
        "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}}


def long_preamble(rng: random.Random, chars: int) -> tuple[str, list[dict[str, Any]]]:
    """A long agent-style system prompt and tool list of about `chars` characters together
    (markdown sections of rules, made-up tools), in the way agents such as OpenClaw write them."""
    parts: list[str] = []
    tools: list[dict[str, Any]] = []
    size = 0
    while size < chars:
        if rng.random() < 0.3:
            tools.append(_long_tool(rng))
            size += len(json.dumps(tools[-1]))
        else:
            section = f"## {rng.choice(_LONG_HEADINGS)}\n" + "\n".join(
                _long_sentence(rng) for _ in range(rng.randint(2, 8)))
            parts.append(section)
            size += len(section) + 2
    return "\n\n".join(parts or ["## Tools"]), tools


def generate_long_context_corpus(n: int, seed: int = 0, min_chars: int = 1_500,
                                 max_chars: int = 120_000) -> list[dict[str, Any]]:
    """`n` ordinary conversations (plain, instructed, tool use, short JSON) behind a long system
    prompt and tool list (log-uniform in [min_chars, max_chars] characters): an agent such as
    OpenClaw sends ~29 k tokens of rules and tools before the user's message, and a model
    trained only on short prompts answers fragments there."""
    rng = random.Random(f"long-{seed}")
    makers = (_plain, _instructed, _tool_use, _tool_use, _json_reply, _drill)
    out = []
    for _ in range(n):
        conv = rng.choice(makers)(rng)
        chars = int(math.exp(rng.uniform(math.log(min_chars), math.log(max_chars))))
        system, extra = long_preamble(rng, chars)
        msgs = [dict(m) for m in conv["messages"]]
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["content"] = f"{system}\n\n{msgs[0]['content']}"
        else:
            msgs.insert(0, {"role": "system", "content": system})
        tools = list(conv.get("tools") or []) + extra
        rng.shuffle(tools)
        out.append({"messages": msgs, "tools": tools})
    return out

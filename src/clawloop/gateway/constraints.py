"""What a chat request's output must look like, as one structural tag for the engine.

- `response_format` `json_object` / `json_schema` → the schema's JSON (strict: a property
  the schema does not name is refused, as OpenAI's strict mode does), with no free
  whitespace by default (`JSON_WHITESPACE`).
- offered tools → every call is `{"name": <an offered name>, "arguments": <that tool's
  parameter schema>}`, written in the served family's format (its tool parser's `call_tag`:
  Hermes `<tool_call>` blocks by default, Llama 3 JSON, Mistral `[TOOL_CALLS]`); `tool_choice`:
  `auto` free text with optional calls (`triggered_tags`),
  `required` at least one call, a named function exactly that call, `none` no tools at
  all (they are not rendered); `parallel_tool_calls: false` ends the reply after the
  first call.
- both: the reply is either the JSON or the tool calls.
- a thinking model (`after_reasoning`): the reasoning is free text up to its end marker, and
  the constraint applies after it.

The same object goes to the hf engine (xgrammar) and to vLLM (`structured_outputs.
structural_tag`), so both engines enforce the same grammar. A schema xgrammar cannot
compile is a 400 naming the parameter it came from.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from clawloop.gateway.protocol import APIError, ChatRequest
from clawloop.gateway.parsers import HermesToolParser, ReasoningParser, ToolParser

JSON_WHITESPACE = 0
"""Whitespace a constrained JSON value may hold in each gap between its tokens, beyond the one space
after every `,` and `:`. 0 (the default) leaves none: the value is written with `json.dumps`'s
separators (`", "`, `": "`, the form chat templates render tool-call arguments in), as vLLM's
`disable_any_whitespace` does. Any freedom is taken by a weak model: the shipped tiny model, allowed
8 characters, wrote `{"a":93\\n\\n\\n\\n\\n\\n\\n\\n,\\n\\n...` until `max_tokens`, so no client got a
parseable object. N > 0 allows up to N whitespace characters in each gap (and no fixed separators):
pretty-printed JSON, for a model that writes it and a budget that pays for it."""
COMPACT_SEPARATORS = (", ", ": ")
EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def _json_format(schema: dict[str, Any], whitespace: int = JSON_WHITESPACE) -> dict[str, Any]:
    bounded = bounded_strings(schema)
    if whitespace == 0:
        ebnf = _compact_grammar(json.dumps(bounded))
        if ebnf is not None:
            return {"type": "grammar", "grammar": ebnf}
    # A schema the converter refuses stays a `json_schema` format: `_check` then names its parameter.
    return {"type": "json_schema", "json_schema": bounded, "style": "json", "max_whitespace_cnt": max(whitespace, 1)}


@lru_cache(maxsize=512)
def _compact_grammar(schema_text: str) -> str | None:
    """The schema as an EBNF grammar with no free whitespace (None when xgrammar cannot convert it).

    xgrammar 0.2.8's structural-tag `json_schema` format takes `max_whitespace_cnt` ≥ 1 only; its
    `any_whitespace=False` (fixed separators) exists only in `Grammar.from_json_schema`, so the
    schema is converted there and embedded as a `grammar` format — the same converter, strict mode
    included, and vLLM (same xgrammar) reads the same tag."""
    from clawloop.engines.grammar import compact_json_grammar  # it imports torch: not at gateway import

    try:
        return compact_json_grammar(schema_text, COMPACT_SEPARATORS)
    except ValueError:
        return None


_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def bounded_strings(schema: Any) -> Any:
    """`schema` with each length-bounded string (`minLength`/`maxLength`, no `pattern`/`format`)
    rewritten as the same bound on a `pattern` of JSON-safe characters.

    xgrammar 0.2.8 (ours and vLLM's) compiles a length-bounded string to `[^"\\\r\n]{min,max}`,
    which lets raw control characters (U+0000-U+001F) into the string: invalid JSON that
    clients' parsers reject. The pattern keeps the bound and excludes them (and escapes)."""
    if isinstance(schema, list):
        return [bounded_strings(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for k in _SUBSCHEMAS:
        if isinstance(out.get(k), (dict, list)):
            out[k] = bounded_strings(out[k])
    for k in _SCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [bounded_strings(s) for s in out[k]]
    for k in _SCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: bounded_strings(s) for name, s in out[k].items()}
    typ = out.get("type")
    if ((typ == "string" or (isinstance(typ, list) and "string" in typ)) and "pattern" not in out
            and "format" not in out and ("minLength" in out or "maxLength" in out)):
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = rf'^[^"\\\x00-\x1f]{{{int(lo)},{hi if hi == "" else int(hi)}}}$'
    return out


HERMES = HermesToolParser()


def tool_tag(tool: dict[str, Any], whitespace: int = JSON_WHITESPACE, parser: ToolParser = HERMES) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or EMPTY_PARAMETERS
    begin, end = parser.call_tag(fn["name"])
    return {"type": "tag", "begin": begin, "content": _json_format(params, whitespace), "end": end}


def _content_format(req: ChatRequest, whitespace: int = JSON_WHITESPACE) -> dict[str, Any] | None:
    rf = req.response_format
    if rf is None:
        return None
    if rf["type"] == "json_object":
        return _json_format({"type": "object"}, whitespace)
    return _json_format(rf["json_schema"]["schema"], whitespace)


def build_constraint(req: ChatRequest, use_tools: bool, constrain_tools: bool = True,
                     json_whitespace: int = JSON_WHITESPACE, *, tools: ToolParser = HERMES) -> dict[str, Any] | None:
    """The structural tag for `req`, or None when its output is free text. `json_whitespace`: see
    `JSON_WHITESPACE` (0, the default: no free whitespace in the JSON; N: up to N characters a gap).
    `tools`: the family's tool parser, whose format the calls are written in."""
    if json_whitespace < 0:
        raise ValueError(f"json_whitespace must be >= 0, got {json_whitespace}")
    ws = json_whitespace
    content = _content_format(req, ws)
    tools_format = None
    if use_tools and req.tools and constrain_tools:
        tc = req.tool_choice
        if isinstance(tc, dict):
            chosen = [t for t in req.tools if t["function"]["name"] == tc["function"]["name"]]
            tools_format = tool_tag(chosen[0], ws, tools)
        else:
            tools_format = {"type": "triggered_tags", "triggers": [tools.trigger],
                            "tags": [tool_tag(t, ws, tools) for t in req.tools],
                            "at_least_one": tc == "required" or content is not None,
                            "stop_after_first": not req.parallel_tool_calls}
    if content is not None and tools_format is not None:
        if isinstance(req.tool_choice, dict) or req.tool_choice == "required":
            fmt = tools_format  # a call is required: the JSON answer is not an option
        else:
            fmt = {"type": "or", "elements": [content, tools_format]}
    else:
        fmt = content or tools_format
    if fmt is None:
        return None
    tag = {"type": "structural_tag", "format": fmt}
    _check(req, tag, ws, tools)
    return tag


def after_reasoning(tag: dict[str, Any] | None, parser: ReasoningParser | None,
                    inside: bool | None) -> dict[str, Any] | None:
    """`tag` for a thinking model: free reasoning up to the parser's end marker, then `tag`'s format.
    `inside`: the prompt opened the reasoning (the output starts in it); otherwise the model may open
    it itself (its start marker first) or answer at once."""
    if tag is None or parser is None or inside is None:
        return tag
    fmt = tag["format"]
    gap = [{"type": "const_string", "value": parser.gap}] if parser.gap else []
    think = {"type": "tag", "begin": "" if inside else parser.start, "content": {"type": "any_text"},
             "end": parser.end}
    after = {"type": "sequence", "elements": [think, *gap, fmt]}
    return {"type": "structural_tag", "format": after if inside else {"type": "or", "elements": [after, fmt]}}


def _check(req: ChatRequest, tag: dict[str, Any], ws: int, tools: ToolParser = HERMES) -> None:
    """400 naming the parameter whose schema does not compile."""
    if _compiles(json.dumps(tag)) is None:
        return
    if req.response_format is not None:
        why = _compiles(json.dumps({"type": "structural_tag", "format": _content_format(req, ws)}))
        if why is not None:
            param = ("response_format.json_schema.schema" if req.response_format["type"] == "json_schema"
                     else "response_format")
            raise APIError(400, f"Invalid schema in '{param}': {why}", param=param, code="invalid_schema")
    for i, t in enumerate(req.tools or ()):
        why = _compiles(json.dumps({"type": "structural_tag", "format": tool_tag(t, ws, tools)}))
        if why is not None:
            param = f"tools[{i}].function.parameters"
            raise APIError(400, f"Invalid schema in '{param}': {why}", param=param, code="invalid_schema")
    raise APIError(400, f"The requested output constraint cannot be built: {_compiles(json.dumps(tag))}",
                   param="response_format", code="invalid_schema")


@lru_cache(maxsize=512)
def _compiles(tag_text: str) -> str | None:
    """None when the tag compiles, else xgrammar's reason (cached: clients repeat their tools)."""
    from clawloop.engines.grammar import check_constraint  # it imports torch: not at gateway import

    try:
        check_constraint(json.loads(tag_text))
    except ValueError as e:
        return str(e) or "does not compile"
    return None

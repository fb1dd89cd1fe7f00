"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) on top of
chat completions.

    await serve_messages(gw, request)     # create_app's route: translate → chat.run_chat → translate back

A Messages request is translated into a chat-completions body and served by `chat.run_chat`, as
the Responses API is, so rendering, constrained decoding, limits, sessions and capture (token-exact
ids and logprobs, the policy version, `X-Session-Id`/`X-Turn-Type`/`X-Session-Done`, side turns,
next-state linking) are exactly the chat path's; the captured turn holds the chat messages below.

Request → chat. `system` (a string or text blocks) is a system message in front. Consecutive
messages of one role are one turn (as Anthropic merges them). A user turn's `tool_result` blocks
become tool messages (each answering its `tool_use_id`, so linking makes the result the tool-call
turn's next state; `is_error: true` prefixes the result with "Error: ", the only way the model can
see it) and its other blocks a user message after them; an assistant turn's `tool_use` blocks are
its `tool_calls` (`input` as JSON arguments). A last assistant turn is a prefill: the answer
continues it (`continue_final_message`). `image` blocks with a base64 source are image parts (the
chat path takes or refuses them as the model can). Tools `{name, description, input_schema}` are
function tools; `tool_choice` auto/any/tool/none is chat's auto/required/named/none and
`disable_parallel_tool_use` is `parallel_tool_calls: false`; `output_config.format` (json_schema)
is `response_format`. `max_tokens` is required (as Anthropic requires it); `stop_sequences`,
`temperature` (0-1) and `top_p` are chat's; `metadata.user_id` is the turn's
`safety_identifier` (recorded, never a session id). The clawloop body fields `session_id`,
`turn_type`, `session_done` and `seed` (reproducible sampling) are chat's; with `return_token_ids`
the Message carries `prompt_token_ids`, `token_ids`, `token_logprobs` and `policy_version`.

Refused by name (400 `invalid_request_error`): `top_k` (the engines sample from the whole
vocabulary), `thinking` other than disabled, `output_config.effort`, `speed: fast`,
`inference_geo`, `container`, `mcp_servers`, `context_management`, `diagnostics`,
`user_profile_id`, `workspace_id`, server tools (any tool `type` but `custom`), tool fields that
change how a tool is called (`defer_loading`, `allowed_callers`, `input_examples`,
`eager_input_streaming`), `document`/`search_result`/`redacted_thinking`/server-tool blocks, citations.
A thinking model's reasoning (chat's `reasoning_content`) is a `thinking` block before the text and
the `tool_use` blocks (`thinking_delta` events while it streams; its `signature` is empty: nothing
signs it); a `thinking` block in an assistant turn of the history is that turn's `reasoning_content`,
for the chat template to render or drop.
`cache_control` (anywhere) is accepted with no effect: it is a billing hint, and the engines
cache prefixes on their own. `anthropic-version` and `anthropic-beta` headers are accepted; a
beta feature's body fields are refused as above. `service_tier` auto/standard_only: one tier.

Chat → Message. Content is a text block (when there is text, or nothing else) then one `tool_use`
block per call (`id`, `name`, `input`: the arguments parsed; `{}` for a call cut off by
`max_tokens` before its arguments closed). `stop_reason`: `end_turn`, `max_tokens`, `tool_use`, or
`stop_sequence` with the matched `stop_sequence` (found after the text in the decoded sampled ids).
A stream is Anthropic's events as SSE with `event:` lines: `message_start`, `ping`, per block
`content_block_start` / `content_block_delta` (`text_delta`, `input_json_delta` as the arguments
are generated) / `content_block_stop`, `message_delta` (stop reason, usage), `message_stop`; a
failure after the headers is an `error` event. Errors are Anthropic's shape (`anthropic_error`,
used by app.py's handlers for these routes): `{"type": "error", "error": {"type", "message"}}`,
400/401/404/413/429, 500 `api_error`, 504 `timeout_error`, and 529 `overloaded_error` (with
`Retry-After`) where chat answers 503 (no engine replica up). `x-api-key` authenticates like
`Authorization: Bearer` (the same tenants).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from clawloop.gateway.chat import render_messages, run_chat
from clawloop.gateway.protocol import MAX_STOP, APIError, bad_value, number_field, parse_chat_request
from clawloop.gateway.serving import Gateway

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               504: "timeout_error", 529: "overloaded_error"}
"""Anthropic's error type per HTTP status (any other 5xx: `api_error`)."""
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
REFUSED = {
    "top_k": "the engines sample from the whole vocabulary (use temperature or top_p)",
    "container": "code-execution containers are not supported",
    "mcp_servers": "MCP servers are not supported: offer their tools as client tools",
    "context_management": "context management is not supported: send the context you want kept",
    "diagnostics": "diagnostics are not supported",
    "inference_geo": "this server has one location",
    "user_profile_id": "user profiles are not supported",
    "workspace_id": "workspaces are not supported: API keys are tenants",
}
"""Messages parameters refused when set to anything but null, and why."""
TOOL_REFUSED = ("defer_loading", "allowed_callers", "input_examples", "eager_input_streaming")
CLAWLOOP_FIELDS = ("session_id", "turn_type", "session_done", "seed")
"""clawloop's extension fields, passed to the chat path as they are (`return_token_ids` is read here)."""
_IGNORED = ("cache_control",)
"""Block keys accepted with no effect (see the module docstring)."""


def anthropic_error(e: APIError) -> tuple[int, dict[str, Any]]:
    """(status, body) of an error in Anthropic's shape; chat's 503 (no replica up) is 529 overloaded."""
    status = 529 if e.status == 503 else e.status
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": kind, "message": e.message}}


# -- request translation --------------------------------------------------------

def _check_keys(block: dict[str, Any], allowed: tuple[str, ...], param: str) -> None:
    for k, v in block.items():
        if k not in allowed and k not in _IGNORED and v is not None:
            raise bad_value(f"{param}.{k}: Extra inputs are not permitted (this server does not support '{k}').",
                            f"{param}.{k}", code="unsupported_parameter")


def _text_block(b: dict[str, Any], p: str) -> dict[str, Any]:
    _check_keys(b, ("type", "text", "citations"), p)
    if not isinstance(b.get("text"), str):
        raise bad_value(f"{p}.text: Input should be a valid string.", f"{p}.text", code="invalid_type")
    if b.get("citations"):
        raise bad_value(f"{p}.citations: citations are not supported.", f"{p}.citations",
                        code="unsupported_parameter")
    return {"type": "text", "text": b["text"]}


def _image_block(b: dict[str, Any], p: str) -> dict[str, Any]:
    """An image block as chat's image part: a base64 source as a data URL (the chat path checks
    it); a URL source as the URL, which the chat path refuses (this server fetches nothing)."""
    src = b.get("source")
    if not isinstance(src, dict):
        raise bad_value(f"{p}.source: Field required.", f"{p}.source", code="missing_required_parameter")
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type')};base64,{src.get('data')}"
    elif src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise bad_value(f"{p}.source.type: expected 'base64' or 'url'.", f"{p}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}


def _blocks(content: Any, p: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_value(f"{p}: Input should be a valid string or a list of content blocks.", p, code="invalid_type")
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_value(f"{p}.{j}: expected a content block object with a 'type'.", f"{p}.{j}",
                            code="invalid_type")
    return content


def _user_turn(blocks: list[tuple[dict[str, Any], str]], names: dict[str, str]) -> list[dict[str, Any]]:
    """One user turn's blocks → tool messages (its tool results, in order) then a user message (the rest)."""
    tools, parts = [], []
    for b, p in blocks:
        kind = b["type"]
        if kind in ("text", "image"):
            parts.append(_part(b, p, ("text", "image")))
        elif kind == "tool_result":
            _check_keys(b, ("type", "tool_use_id", "content", "is_error"), p)
            tid = b.get("tool_use_id")
            if not isinstance(tid, str) or not tid:
                raise bad_value(f"{p}.tool_use_id: Field required.", f"{p}.tool_use_id",
                                code="missing_required_parameter")
            inner = b.get("content")
            content = [] if inner is None else [_part(x, f"{p}.content.{k}", ("text", "image"))
                                                for k, x in enumerate(_blocks(inner, f"{p}.content"))]
            if b.get("is_error"):
                content = [{"type": "text", "text": "Error: "}] + content
            msg = {"role": "tool", "tool_call_id": tid, "content": content}
            if tid in names:
                msg["name"] = names[tid]
            tools.append(msg)
        else:
            _part(b, p, ())
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _assistant_turn(blocks: list[tuple[dict[str, Any], str]], names: dict[str, str]) -> dict[str, Any]:
    parts, calls, thinking = [], [], []
    for b, p in blocks:
        if b["type"] == "text":
            parts.append(_part(b, p, ("text",)))
        elif b["type"] == "thinking":
            if not isinstance(b.get("thinking"), str):
                raise bad_value(f"{p}.thinking: Input should be a valid string.", f"{p}.thinking", code="invalid_type")
            thinking.append(b["thinking"])
        elif b["type"] == "tool_use":
            _check_keys(b, ("type", "id", "name", "input", "caller"), p)
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_value(f"{p}: a tool_use block needs a string 'id' and 'name'.", p,
                                code="missing_required_parameter")
            if not isinstance(b.get("input"), dict):
                raise bad_value(f"{p}.input: Input should be a valid dictionary.", f"{p}.input", code="invalid_type")
            names[b["id"]] = b["name"]
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        else:
            _part(b, p, ())
    msg: dict[str, Any] = {"role": "assistant", "content": parts or (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


def _part(b: dict[str, Any], p: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    """A text or image block (of `kinds`) as a chat content part; any other block is refused here."""
    if b["type"] in kinds:
        return _text_block(b, p) if b["type"] == "text" else _image_block(b, p)
    raise bad_value(f"{p}.type: a content block of type {b['type']!r} is not accepted here (this server takes "
                    "text and image blocks from users, text and tool_use from the assistant, tool_result with "
                    "text or images, text in the system prompt).", f"{p}.type", code="unsupported_content")


def messages_to_chat(raw: Any, system: Any) -> list[dict[str, Any]]:
    """Anthropic `system` + `messages` → chat messages (see the module docstring)."""
    if raw is None:
        raise bad_value("messages: Field required.", "messages", code="missing_required_parameter")
    if not isinstance(raw, list) or not raw:
        raise bad_value("messages: expected a non-empty list of messages.", "messages")
    out: list[dict[str, Any]] = []
    if system is not None and system != "":
        out.append({"role": "system", "content": [_part(b, f"system.{j}", ("text",))
                                                  for j, b in enumerate(_blocks(system, "system"))]})
    turns: list[tuple[str, list[tuple[dict[str, Any], str]]]] = []
    for i, m in enumerate(raw):
        p = f"messages.{i}"
        if not isinstance(m, dict):
            raise bad_value(f"{p}: Input should be a valid dictionary.", p, code="invalid_type")
        role = m.get("role")
        if role not in ("user", "assistant"):
            hint = " (a system prompt goes in the top-level 'system' parameter)" if role == "system" else ""
            raise bad_value(f"{p}.role: Input should be 'user' or 'assistant', not {role!r}{hint}.", f"{p}.role")
        if "content" not in m:
            raise bad_value(f"{p}.content: Field required.", f"{p}.content", code="missing_required_parameter")
        blocks = [(b, f"{p}.content.{j}") for j, b in enumerate(_blocks(m["content"], f"{p}.content"))]
        if m["content"] in ("", []) and not (role == "assistant" and i == len(raw) - 1):
            # as Anthropic: an empty user turn would otherwise turn the assistant's before it into a prefill
            raise bad_value(f"{p}.content: all messages must have non-empty content except for the optional "
                            "final assistant message.", f"{p}.content")
        if turns and turns[-1][0] == role:  # consecutive turns of one role are one turn
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    names: dict[str, str] = {}  # tool_use id → tool name, for the tool messages
    for role, blocks in turns:
        out += _user_turn(blocks, names) if role == "user" else [_assistant_turn(blocks, names)]
    return out


def _tool(t: Any, p: str) -> dict[str, Any]:
    """A client tool as a chat function tool; server tools and fields that change how a tool is
    called are refused."""
    if not isinstance(t, dict):
        raise bad_value(f"{p}: Input should be a valid dictionary.", p, code="invalid_type")
    if t.get("type") not in (None, "custom"):
        raise bad_value(f"{p}.type: server tools ({t['type']!r}) are not supported: offer client tools "
                        "(name, description, input_schema).", f"{p}.type", code="unsupported_value")
    for k in TOOL_REFUSED:
        if t.get(k) not in (None, False, []):
            raise bad_value(f"{p}.{k}: not supported by this server.", f"{p}.{k}", code="unsupported_parameter")
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise bad_value(f"{p}.name: Field required.", f"{p}.name", code="missing_required_parameter")
    if not isinstance(t.get("input_schema"), dict):
        raise bad_value(f"{p}.input_schema: Field required (a JSON schema object).", f"{p}.input_schema",
                        code="missing_required_parameter")
    fn = {"name": t["name"], "parameters": t["input_schema"]}
    fn.update({k: t[k] for k in ("description", "strict") if t.get(k) is not None})
    return {"type": "function", "function": fn}


def _tool_choice(raw: Any) -> tuple[Any, bool | None]:
    """(chat tool_choice, parallel_tool_calls) of Anthropic's `tool_choice`."""
    if raw is None:
        return None, None
    if not isinstance(raw, dict) or raw.get("type") not in ("auto", "any", "tool", "none"):
        raise bad_value("tool_choice: expected {'type': 'auto' | 'any' | 'tool' | 'none'}.", "tool_choice")
    kind = raw["type"]
    parallel = None if raw.get("disable_parallel_tool_use") is None else not raw["disable_parallel_tool_use"]
    if kind == "tool":
        if not isinstance(raw.get("name"), str) or not raw["name"]:
            raise bad_value("tool_choice.name: Field required.", "tool_choice.name", code="missing_required_parameter")
        return {"type": "function", "function": {"name": raw["name"]}}, parallel
    return {"any": "required"}.get(kind, kind), parallel


def _response_format(output_config: Any) -> dict[str, Any] | None:
    if output_config is None:
        return None
    if not isinstance(output_config, dict):
        raise bad_value("output_config: Input should be a valid dictionary.", "output_config", code="invalid_type")
    if output_config.get("effort") is not None:
        raise bad_value("output_config.effort: this model has no effort setting.", "output_config.effort",
                        code="unsupported_parameter")
    fmt = output_config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad_value("output_config.format: expected {'type': 'json_schema', 'schema': {...}}.",
                        "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


@dataclass
class MessagesRequest:
    chat: dict[str, Any]
    """The chat-completions body it is served as."""
    stops: list[str]
    stream: bool
    token_ids: bool
    """The client asked for the clawloop token fields (`return_token_ids`)."""


def parse_messages_request(body: dict[str, Any], *, count_only: bool = False) -> MessagesRequest:
    """A Messages body checked and translated; `count_only` for count_tokens (no `max_tokens`)."""
    for key, why in REFUSED.items():
        if body.get(key) is not None:
            raise bad_value(f"{key}: not supported by this server: {why}.", key, code="unsupported_parameter")
    thinking = body.get("thinking")
    if thinking is not None and (not isinstance(thinking, dict) or thinking.get("type") != "disabled"):
        raise bad_value("thinking: this model does not think before answering (only {'type': 'disabled'}).",
                        "thinking", code="unsupported_parameter")
    if body.get("speed") not in (None, "standard"):
        raise bad_value("speed: only 'standard' is supported.", "speed", code="unsupported_parameter")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise bad_value("service_tier: expected 'auto' or 'standard_only'.", "service_tier")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_value("model: Field required (a string).", "model", code="missing_required_parameter")
    chat: dict[str, Any] = {"model": model, "messages": messages_to_chat(body.get("messages"), body.get("system")),
                            "return_token_ids": True}
    if chat["messages"][-1]["role"] == "assistant":  # a prefill: the answer continues it
        chat["continue_final_message"], chat["add_generation_prompt"] = True, False
    mt = body.get("max_tokens")
    if mt is None and not count_only:
        raise bad_value("max_tokens: Field required.", "max_tokens", code="missing_required_parameter")
    if mt is not None:
        chat["max_tokens"] = number_field(body, "max_tokens", 1, 2**31, 0, integer=True)
    for key, lo_open in (("temperature", False), ("top_p", True)):
        v = number_field(body, key, 0.0, 1.0, None, lo_open=lo_open)
        if v is not None:
            chat[key] = v
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_value("stop_sequences: expected a list of non-empty strings.", "stop_sequences")
    if len(stops) > MAX_STOP:
        raise bad_value(f"stop_sequences: at most {MAX_STOP} sequences.", "stop_sequences")
    if stops:
        chat["stop"] = stops
    raw_tools = body.get("tools")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise bad_value("tools: Input should be a valid list.", "tools", code="invalid_type")
    tools = [_tool(t, f"tools.{i}") for i, t in enumerate(raw_tools or ())] or None
    tool_choice, parallel = _tool_choice(body.get("tool_choice"))
    for key, value in (("tools", tools), ("tool_choice", tool_choice), ("parallel_tool_calls", parallel),
                       ("response_format", _response_format(body.get("output_config")))):
        if value is not None:
            chat[key] = value
    md = body.get("metadata")
    if md is not None:
        if not isinstance(md, dict) or any(k != "user_id" for k in md):
            raise bad_value("metadata: only 'user_id' is accepted.", "metadata")
        if md.get("user_id") is not None:
            chat["safety_identifier"] = md["user_id"]
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_value("stream: Input should be a valid boolean.", "stream", code="invalid_type")
    if stream:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    for key in CLAWLOOP_FIELDS:
        if body.get(key) is not None:
            chat[key] = body[key]
    return MessagesRequest(chat, stops, stream, body.get("return_token_ids") is True)


# -- response shapes ---------------------------------------------------------------

def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        args = None
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": args if isinstance(args, dict) else {}}


def stop_of(gw: Gateway, finish_reason: str | None, text: str, ids: list[int],
            stops: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). Chat says `stop` for the end-of-turn token and for a stop string
    alike; a stop string is what the sampled ids decode to right after the text shown (the stream
    cut there), else, for text chat re-cut around tool calls, the earliest one in them."""
    if finish_reason == "stop" and stops:
        full = gw.tok.decode(ids, skip_special_tokens=True)
        hit = [s for s in stops if full.startswith(s, len(text))]
        if not hit and full[:len(text)] != text:
            hit = sorted((s for s in stops if s in full), key=full.find)
        if hit:
            return "stop_sequence", hit[0]
    return STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


def _token_fields(first: dict[str, Any], ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {"prompt_token_ids": first.get("prompt_token_ids"), "token_ids": ids, "token_logprobs": logprobs,
            "policy_version": first.get("policy_version")}


async def serve_messages(gw: Gateway, request: Request) -> Response:
    """POST /v1/messages."""
    tenant, body = await gw.accept(request)
    req = parse_messages_request(body)
    resp = await run_chat(gw, request, req.chat, tenant, rid_prefix="msg")
    version = resp.headers.get("x-policy-version", "")
    if isinstance(resp, StreamingResponse):
        return StreamingResponse(_stream(gw, req, resp.body_iterator), media_type="text/event-stream",
                                 headers={"X-Policy-Version": version, "Cache-Control": "no-cache"},
                                 background=resp.background)
    out = json.loads(resp.body)
    choice = out["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content") or not msg.get("tool_calls"):
        content.append({"type": "text", "text": msg.get("content") or ""})
    content += [_tool_use(c) for c in msg.get("tool_calls") or []]
    reason, seq = stop_of(gw, choice["finish_reason"], msg.get("content") or "", choice["token_ids"], req.stops)
    message = {"id": out["id"], "type": "message", "role": "assistant", "model": out["model"], "content": content,
               "stop_reason": reason, "stop_sequence": seq,
               "usage": {"input_tokens": out["usage"]["prompt_tokens"],
                         "output_tokens": out["usage"]["completion_tokens"]}}
    if req.token_ids:
        message.update(_token_fields(out, choice["token_ids"], choice["token_logprobs"]))
    return JSONResponse(message, headers={"X-Policy-Version": version})


async def count_tokens(gw: Gateway, request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's length under the chat template, as served."""
    _, body = await gw.accept(request)
    chat = parse_messages_request(body, count_only=True).chat
    max_len = gw.cfg.model.max_model_len
    req = parse_chat_request(chat, max_len, images=gw.images)
    use_tools = bool(req.tools) and req.tool_choice != "none"
    return JSONResponse({"input_tokens": len(await render_messages(gw, req, use_tools, max_len))})


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n"


class _StreamTranslator:
    """chat.completion.chunk events in, Anthropic stream events out (see the module docstring)."""

    def __init__(self, gw: Gateway, req: MessagesRequest):
        self.gw, self.req = gw, req
        self.first: dict[str, Any] | None = None
        self.blocks = 0
        self.open: str | None = None
        """The kind of the block being streamed ("thinking", "text" or a tool call's chat index), None between."""
        self.thought = 0
        """1 once a thinking block was streamed (it is not the answer's block)."""
        self.text: list[str] = []
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.failed = False

    def feed(self, data: dict[str, Any]) -> list[str]:
        """The events for one chat chunk (an error chunk: one error event)."""
        if "error" in data:
            self.failed = True
            status = {"engine_unavailable": 503, "timeout": 504}.get(data["error"].get("code"), 500)
            _, err = anthropic_error(APIError(status, data["error"].get("message", "")))
            return [_event("error", error=err["error"])]
        out: list[str] = []
        if self.first is None:
            self.first = data
            out.append(_event("message_start", message={
                "id": data["id"], "type": "message", "role": "assistant", "model": data["model"], "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": len(data.get("prompt_token_ids") or ()), "output_tokens": 0}}))
            out.append(_event("ping"))
        self.usage = data.get("usage") or self.usage
        for ch in data.get("choices") or []:
            self.ids += ch.get("token_ids") or []
            self.logprobs += ch.get("token_logprobs") or []
            delta = ch.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                self.thought = 1
                out.append(_event("content_block_delta", index=self.blocks - 1,
                                  delta={"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
            if delta.get("content"):
                out += self._open("text", {"type": "text", "text": ""})
                self.text.append(delta["content"])
                out.append(_event("content_block_delta", index=self.blocks - 1,
                                  delta={"type": "text_delta", "text": delta["content"]}))
            for tc in delta.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if tc.get("id"):  # a call's first delta names it
                    out += self._open(f"call{tc.get('index', 0)}", {"type": "tool_use", "id": tc["id"],
                                                                     "name": fn.get("name") or "", "input": {}})
                if fn.get("arguments"):
                    out.append(_event("content_block_delta", index=self.blocks - 1,
                                      delta={"type": "input_json_delta", "partial_json": fn["arguments"]}))
            self.finish_reason = ch.get("finish_reason") or self.finish_reason
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        if self.open == kind:
            return []
        out = self._close()
        self.open = kind
        self.blocks += 1
        return out + [_event("content_block_start", index=self.blocks - 1, content_block=block)]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", index=self.blocks - 1)]

    def finish(self) -> list[str]:
        # an empty answer has its block
        out = [] if self.blocks > self.thought else self._open("text", {"type": "text", "text": ""})
        out += self._close()
        reason, seq = stop_of(self.gw, self.finish_reason, "".join(self.text), self.ids, self.req.stops)
        usage = {"input_tokens": self.usage.get("prompt_tokens", 0), "output_tokens": self.usage.get(
            "completion_tokens", len(self.ids))}
        extra = _token_fields(self.first or {}, self.ids, self.logprobs) if self.req.token_ids else {}
        out.append(_event("message_delta", delta={"stop_reason": reason, "stop_sequence": seq}, usage=usage, **extra))
        return out + [_event("message_stop")]


async def _stream(gw: Gateway, req: MessagesRequest, chunks: Any) -> AsyncIterator[str]:
    """The chat stream re-cut into Anthropic events. Each piece the chat stream yields is whole
    SSE events, one `data:` line each (serving.drain joins complete ones)."""
    t = _StreamTranslator(gw, req)
    try:
        async for raw in chunks:
            for line in (raw if isinstance(raw, str) else raw.decode()).splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for out in t.feed(json.loads(line[len("data: "):])):
                        yield out
        if not t.failed:
            for out in t.finish():
                yield out
    finally:
        await chunks.aclose()  # a client that left stops the chat stream (its turn kept as aborted)

"""The Responses API (`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`) on top of chat completions.

    api = ResponsesAPI(gw)            # create_app does this
    await api.create(request)         # translate → chat.run_chat → translate back

A Responses request is translated into a chat-completions body and served by `chat.run_chat`,
so rendering, constrained decoding, limits and capture are exactly the chat path's. Input items
become chat messages: `message` items (text parts only), `function_call` items (an assistant
message's tool calls; consecutive ones and the assistant text before them merge into one message,
as chat has it) and `function_call_output` items (tool messages). `instructions` is a system
message in front. Flat function tools `{"type": "function", "name", "parameters", ...}` become chat
tools, `text.format` becomes `response_format`, `max_output_tokens` `max_completion_tokens`.
A stream is the chat stream re-cut into Responses events (`response.created`, `.in_progress`,
`.output_item.added`, `.content_part.added`, `.output_text.delta`/`.done`,
`.function_call_arguments.delta`/`.done`, `.content_part.done`, `.output_item.done`, then
`response.completed`, or `response.incomplete` when `max_output_tokens` cut it), each with
`sequence_number`, no `[DONE]`.

Sessions, natively: a response is stored with the chat messages it added and its output, so
`previous_response_id` continues it: the chain's messages, then the new input. The continuation
goes into the same capture session: the one the chain named (an explicit `X-Session-Id`,
`session_id` or `user` on any request of it, inherited by the next), else the one capture infers
from the history, which ends with the exact answer that was served (header-less chat clients get
the same). An explicit session id on a request always wins. Responses are stored per tenant in
`DATA_DIR/responses.sqlite`: another tenant's id is a 404. `store: false` keeps nothing: no stored
response (so it cannot be continued or fetched) and, as in chat, no captured turn.

Refused with a 400 naming the parameter: non-function tools, `tool_choice` `allowed_tools`,
image/file/audio input, `item_reference` items, `background`, `conversation`,
`prompt`, `reasoning` settings, `truncation: "auto"`, `max_tool_calls`, `include` other than
`message.output_text.logprobs`, `text.verbosity` other than `medium`. `metadata`,
`service_tier`, `prompt_cache_key`, `prompt_cache_retention`, `safety_identifier` go to the chat
path as they are; `stream_options` (obfuscation) has no effect; `user` names the session, as in
chat.

A thinking model's reasoning (chat's `reasoning_content`) is a `reasoning` output item before the
message and the calls (`response.reasoning_text.delta` events while it streams); a `reasoning` input
item gives its text to the assistant message after it, for the chat template to render or drop.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from clawloop.gateway.chat import run_chat
from clawloop.gateway.protocol import APIError, bad_value
from clawloop.gateway.responses_store import ResponseRecord, ResponseStore
from clawloop.gateway.serving import Gateway


LOGPROBS_INCLUDE = "message.output_text.logprobs"
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")


def _hex() -> str:
    return uuid.uuid4().hex


# -- request translation --------------------------------------------------------

def _text(content: Any, param: str, role: str) -> str:
    """A message's content as text: a string, or text parts joined (input_text/output_text/refusal)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_value(f"Invalid type for '{param}': expected a string or a list of content parts.", param,
                   code="invalid_type")
    out = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise bad_value(f"Invalid type for '{p}': expected an object.", p, code="invalid_type")
        t = part.get("type")
        key = "refusal" if t == "refusal" else "text"
        if t in ("input_text", "output_text", "text") or (t == "refusal" and role == "assistant"):
            if not isinstance(part.get(key), str):
                raise bad_value(f"Invalid value for '{p}.{key}': expected a string.", f"{p}.{key}", code="invalid_type")
            out.append(part[key])
        else:
            raise bad_value(f"Unsupported content part type {t!r} at '{p}': this model takes text only.", f"{p}.type",
                       code="unsupported_content")
    return "".join(out)


def input_to_messages(raw: Any) -> list[dict[str, Any]]:
    """Responses `input` (a string or a list of items) → chat messages."""
    if isinstance(raw, str):
        if not raw:
            raise bad_value("Invalid value for 'input': the input is empty.", "input")
        return [{"role": "user", "content": raw}]
    if raw is None:
        raise bad_value("Missing required parameter: 'input'.", "input", code="missing_required_parameter")
    if not isinstance(raw, list) or not raw:
        raise bad_value("Invalid value for 'input': expected a non-empty string or a non-empty list of items.", "input")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id → function name, for the tool messages
    reasoning: str | None = None  # a reasoning item's text, for the assistant message that follows it
    for i, item in enumerate(raw):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_value(f"Invalid type for '{p}': expected an object.", p, code="invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise bad_value(f"Invalid value for '{p}.role': {role!r}. Supported: {', '.join(_MESSAGE_ROLES)}.",
                           f"{p}.role")
            if "content" not in item:
                raise bad_value(f"Missing required parameter: '{p}.content'.", f"{p}.content",
                           code="missing_required_parameter")
            out.append({"role": role, "content": _text(item["content"], f"{p}.content", role)})
            if role == "assistant" and reasoning is not None:
                out[-1]["reasoning_content"], reasoning = reasoning, None
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            parts = parts if isinstance(parts, list) else []
            reasoning = "".join(x.get("text") or "" for x in parts if isinstance(x, dict))
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise bad_value(f"Invalid value for '{p}.{key}': expected a string.", f"{p}.{key}",
                               code="missing_required_parameter" if key not in item else "invalid_type")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            names[item["call_id"]] = item["name"]
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # one assistant turn: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if reasoning is not None:
                    out[-1]["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_value(f"Missing required parameter: '{p}.call_id'.", f"{p}.call_id",
                           code="missing_required_parameter")
            if "output" not in item:
                raise bad_value(f"Missing required parameter: '{p}.output'.", f"{p}.output",
                           code="missing_required_parameter")
            msg = {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"], f"{p}.output",
                                                                                   "tool")}
            if item["call_id"] in names:
                msg["name"] = names[item["call_id"]]
            out.append(msg)
        else:
            raise bad_value(f"Unsupported input item type {kind!r} at '{p}': this server takes message, reasoning, "
                       "function_call and function_call_output items.", f"{p}.type", code="unsupported_value")
    return out


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_value("Invalid type for 'tools': expected an array.", "tools", code="invalid_type")
    out = []
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad_value(f"Unsupported tool type {kind!r} at '{p}.type': only function tools are supported.",
                       f"{p}.type", code="unsupported_value")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise bad_value(f"Missing required parameter: '{p}.name'.", f"{p}.name", code="missing_required_parameter")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(raw: Any) -> Any:
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    raise bad_value("Invalid value for 'tool_choice': expected 'auto', 'none', 'required' or "
               "{'type': 'function', 'name'}.", "tool_choice", code="unsupported_value")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_value("Invalid type for 'text': expected an object.", "text", code="invalid_type")
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise bad_value(f"Invalid value for 'text.verbosity': {verbosity!r} is not supported (only 'medium').",
                   "text.verbosity", code="unsupported_value")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_value("Invalid type for 'text.format': expected an object.", "text.format", code="invalid_type")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_value("Missing required parameter: 'text.format.schema'.", "text.format.schema",
                       code="missing_required_parameter")
        js = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        js.setdefault("name", "response")
        return {"type": "json_schema", "json_schema": js}
    raise bad_value(f"Invalid value for 'text.format.type': {kind!r} (text, json_object or json_schema).",
               "text.format.type")


@dataclass
class _SessionFields:
    """What `Gateway.session_of` reads off a request body (a `serving.SessionFields`)."""

    session_id: str | None = None
    turn_type: str | None = None
    session_done: bool = False
    user: str | None = None


@dataclass
class ResponsesRequest:
    input_messages: list[dict[str, Any]]
    """The chat messages this request adds (its `input`)."""
    chat: dict[str, Any]
    """The chat-completions body, without `messages`."""
    echo: dict[str, Any]
    """Request fields the Response object repeats."""
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    logprobs: bool = False
    session: _SessionFields = field(default_factory=_SessionFields)


_CHAT_AS_IS = ("store", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier")
"""Responses parameters with the same name and meaning in chat: passed through as they are."""
_REFUSED = {
    "background": "background mode is not supported: send the request and wait for it (or stream it)",
    "conversation": "conversations are not supported: continue with 'previous_response_id'",
    "prompt": "stored prompt templates are not supported: send 'input' and 'instructions'",
    "max_tool_calls": "a limit on tool calls is not supported",
}


def parse_responses_request(body: dict[str, Any]) -> ResponsesRequest:
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, False):
            raise bad_value(f"'{key}' is not supported by this server: {why}.", key, code="unsupported_parameter")
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or any(v is not None for v in reasoning.values())):
        raise bad_value("'reasoning' settings are not supported by this model.", "reasoning", code="unsupported_parameter")
    if body.get("truncation") not in (None, "disabled"):
        raise bad_value("'truncation: auto' is not supported: an input over the context is refused instead.",
                   "truncation", code="unsupported_parameter")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise bad_value("Invalid type for 'model': expected a string.", "model", code="invalid_type")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_value("Invalid type for 'instructions': expected a string.", "instructions", code="invalid_type")
    prev = body.get("previous_response_id")
    if prev is not None and (not isinstance(prev, str) or not prev):
        raise bad_value("Invalid type for 'previous_response_id': expected a string.", "previous_response_id",
                   code="invalid_type")
    for key in ("stream", "store", "parallel_tool_calls"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise bad_value(f"Invalid type for '{key}': expected a boolean.", key, code="invalid_type")
    include = body.get("include") or []
    if not isinstance(include, list) or any(x != LOGPROBS_INCLUDE for x in include):
        raise bad_value(f"Invalid value for 'include': only '{LOGPROBS_INCLUDE}' is supported.", "include",
                   code="unsupported_value")
    top_logprobs = body.get("top_logprobs")
    stream = bool(body.get("stream"))
    req = ResponsesRequest(input_messages=input_to_messages(body.get("input")), chat={}, echo={},
                           instructions=instructions, previous_response_id=prev,
                           store=body.get("store") is not False, stream=stream)
    req.logprobs = bool(include) or bool(top_logprobs)
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"))
    response_format = _response_format(body.get("text"))
    chat: dict[str, Any] = {"model": model, "stream": stream}
    if stream:
        chat["stream_options"] = {"include_usage": True}
    for src, dst, value in (("tools", "tools", tools), ("tool_choice", "tool_choice", tool_choice),
                            ("text", "response_format", response_format),
                            ("max_output_tokens", "max_completion_tokens", body.get("max_output_tokens")),
                            ("temperature", "temperature", body.get("temperature")),
                            ("top_p", "top_p", body.get("top_p")),
                            ("parallel_tool_calls", "parallel_tool_calls", body.get("parallel_tool_calls")),
                            ("top_logprobs", "top_logprobs", top_logprobs)):
        if value is not None:
            chat[dst] = value
    for key in _CHAT_AS_IS:  # validated (and honoured) by the chat path
        if body.get(key) is not None:
            chat[key] = body[key]
    if req.logprobs:
        chat["logprobs"] = True
    req.chat = chat
    fmt = (body.get("text") or {}).get("format") or {"type": "text"}
    req.echo = {"model": model, "instructions": instructions, "max_output_tokens": body.get("max_output_tokens"),
                "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "previous_response_id": prev, "store": req.store,
                "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
                "text": {"format": fmt, "verbosity": "medium"},
                "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
                "top_logprobs": top_logprobs or 0, "truncation": "disabled", "user": body.get("user"),
                "metadata": body.get("metadata") or {}, "reasoning": {"effort": None, "summary": None},
                "service_tier": "default" if body.get("service_tier") in (None, "auto") else body["service_tier"],
                "prompt_cache_key": body.get("prompt_cache_key"), "safety_identifier": body.get("safety_identifier")}
    sid, tt, user = body.get("session_id"), body.get("turn_type"), body.get("user")
    for key, v in (("session_id", sid), ("user", user)):
        if v is not None and not isinstance(v, str):
            raise bad_value(f"Invalid type for '{key}': expected a string.", key, code="invalid_type")
    if tt is not None and tt not in ("main", "side"):
        raise bad_value(f"Invalid value for 'turn_type': {tt!r} (main or side).", "turn_type")
    req.session = _SessionFields(sid or None, tt, body.get("session_done", False) in (True, 1, "1", "true"),
                                 user or None)
    return req


def _chat_param(param: str | None) -> str | None:
    """A chat-completions parameter name as the Responses request spells it."""
    if param is None:
        return None
    if param in ("max_completion_tokens", "max_tokens"):
        return "max_output_tokens"
    if param.startswith("messages"):
        return "input"
    if param.startswith("response_format"):
        return "text.format"
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".")
    return param


# -- response shapes ---------------------------------------------------------------

def _usage(u: dict[str, Any] | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {"input_tokens": u["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": (u.get("completion_tokens_details") or {}).get(
                "reasoning_tokens", 0)},
            "total_tokens": u["total_tokens"]}


def _logprobs(block: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries → Responses' (the same fields)."""
    if not block:
        return []
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e.get("bytes"),
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t.get("bytes")}
                              for t in e.get("top_logprobs") or []]}
            for e in block.get("content") or []]


def _message_item(text: str, status: str, logprobs: list[dict[str, Any]], item_id: str | None = None) -> dict:
    return {"id": item_id or f"msg_{_hex()}", "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}]}


def _reasoning_item(text: str, item_id: str | None = None) -> dict:
    return {"id": item_id or f"rs_{_hex()}", "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(call: dict[str, Any], status: str = "completed", item_id: str | None = None) -> dict:
    return {"id": item_id or f"fc_{_hex()}", "type": "function_call", "status": status, "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"]}


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


class ResponsesAPI:
    """The /v1/responses routes of one gateway; responses are stored under `cfg.data_dir`."""

    def __init__(self, gw: Gateway):
        self.gw = gw
        self.store = ResponseStore(Path(gw.cfg.data_dir) / "responses.sqlite")

    def response_object(self, rid: str, req: ResponsesRequest, created: float, status: str,
                        output: list[dict[str, Any]], usage: dict[str, Any] | None,
                        incomplete: dict[str, str] | None = None,
                        error: dict[str, Any] | None = None) -> dict[str, Any]:
        echo = dict(req.echo)
        echo["model"] = echo["model"] or self.gw.cfg.serve.served_model_name
        return {"id": rid, "object": "response", "created_at": created, "status": status, "error": error,
                "incomplete_details": incomplete, **echo, "output": output, "usage": usage,
                "completed_at": time.time() if status == "completed" else None}

    async def _save(self, rid: str, req: ResponsesRequest, sid: str | None, tenant: str, assistant: dict[str, Any],
                    obj: dict[str, Any]) -> None:
        if req.store:
            await self.store.put(ResponseRecord(rid, tenant, req.previous_response_id, sid,
                                                req.input_messages + [assistant], obj, obj["created_at"]))

    async def create(self, request: Request) -> Response:
        gw = self.gw
        tenant, body = await gw.accept(request)
        req = parse_responses_request(body)
        sid, turn_type, done = gw.session_of(request, req.session, tenant)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            found = await self.store.conversation(req.previous_response_id, tenant)
            if found is None:
                raise APIError(404, f"Previous response with id '{req.previous_response_id}' not found (or a "
                               "response it continues was deleted).",
                               param="previous_response_id", code="previous_response_not_found")
            prev, history = found
            sid = sid or prev.session_id
        messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history \
            + req.input_messages
        created = time.time()
        try:
            resp = await run_chat(gw, request, {**req.chat, "messages": messages}, tenant,
                                  session=(sid, turn_type, done), rid_prefix="resp")
        except APIError as e:
            e.param = _chat_param(e.param)
            raise
        if isinstance(resp, StreamingResponse):
            return StreamingResponse(self._stream(resp, req, sid, tenant, created), media_type="text/event-stream",
                                     headers={"X-Policy-Version": resp.headers.get("x-policy-version", ""),
                                              "Cache-Control": "no-cache"}, background=resp.background)
        body = json.loads(resp.body)
        choice = body["choices"][0]
        msg = choice["message"]
        status, incomplete = _status(choice["finish_reason"])
        output = [_reasoning_item(msg["reasoning_content"])] if msg.get("reasoning_content") else []
        if msg.get("content") or not msg.get("tool_calls"):
            output.append(_message_item(msg.get("content") or "", status,
                                        _logprobs(choice.get("logprobs")) if req.logprobs else []))
        output += [_call_item(c) for c in msg.get("tool_calls") or []]
        obj = self.response_object(body["id"], req, created, status, output, _usage(body.get("usage")),
                                   incomplete)
        await self._save(body["id"], req, sid, tenant,
                         _assistant(msg.get("content"), msg.get("tool_calls"), msg.get("reasoning_content")), obj)
        return JSONResponse(obj, headers={"X-Policy-Version": resp.headers.get("x-policy-version", "")})

    async def retrieve(self, request: Request, response_id: str) -> Response:
        rec = await self.store.get(response_id, self.gw.check_auth(request))
        if rec is None:
            raise _not_found(response_id)
        return JSONResponse(rec.response)

    async def delete(self, request: Request, response_id: str) -> Response:
        if not await self.store.delete(response_id, self.gw.check_auth(request)):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    async def _stream(self, resp: StreamingResponse, req: ResponsesRequest, sid: str | None, tenant: str,
                      created: float) -> AsyncIterator[str]:
        t = _StreamTranslator(self, req, created)
        chunks = resp.body_iterator
        try:
            async for raw in chunks:
                for out in t.feed(raw if isinstance(raw, str) else raw.decode()):
                    yield out
            if t.failed:
                return
            obj = t.final()
            msg = _assistant(t.content_text(), t.tool_calls(), t.reasoning())
            await self._save(obj["id"], req, sid, tenant, msg, obj)
            for out in t.finish(obj):
                yield out
        finally:
            await chunks.aclose()  # a client that left stops the chat stream (its turn kept as aborted)


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found")


def _assistant(content: str | None, calls: list[dict[str, Any]] | None,
               reasoning: str | None = None) -> dict[str, Any]:
    """The assistant message a response adds to its conversation, as chat served it."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                             for c in calls]
    elif content is None:
        msg["content"] = ""
    return msg


class _StreamTranslator:
    """chat.completion.chunk events in, Responses stream events out (see the module docstring)."""

    def __init__(self, api: ResponsesAPI, req: ResponsesRequest, created: float):
        self.api, self.req, self.created = api, req, created
        self.rid: str | None = None
        self.seq = 0
        self.buf = ""
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        """The output item being streamed (a message or a function call)."""
        self.text: list[str] = []
        self.lps: list[dict[str, Any]] = []
        self.calls: dict[int, dict[str, Any]] = {}
        """chat tool-call index → its function_call item."""
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.failed = False
        self._pending: list[str] = []

    def _event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"

    def _start(self, rid: str) -> list[str]:
        self.rid = rid
        obj = self.api.response_object(rid, self.req, self.created, "in_progress", [], None)
        return [self._event("response.created", response=obj), self._event("response.in_progress", response=obj)]

    def feed(self, raw: str) -> list[str]:
        out: list[str] = []
        self.buf += raw
        *events, self.buf = self.buf.split("\n\n")
        for ev in events:
            ev = ev.strip()
            if not ev.startswith("data: ") or ev == "data: [DONE]":
                continue
            data = json.loads(ev[6:])
            if "error" in data:
                out += self._fail(data["error"])
                continue
            if self.rid is None:
                out += self._start(data["id"])
            if data.get("usage"):
                self.usage = data["usage"]
            for ch in data.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("reasoning_content"):
                    out += self._reasoning(delta["reasoning_content"])
                if delta.get("content"):
                    out += self._content(delta["content"], _logprobs(ch.get("logprobs")) if self.req.logprobs else [])
                for tc in delta.get("tool_calls") or []:
                    out += self._tool_call(tc)
                if ch.get("finish_reason"):
                    self.finish_reason = ch["finish_reason"]
        return out

    def _open_message(self) -> list[str]:
        out = self._close()
        self.open = _message_item("", "in_progress", [])
        self.open["content"] = []
        self.text, self.lps = [], []
        out.append(self._event("response.output_item.added", output_index=len(self.output), item=self.open))
        out.append(self._event("response.content_part.added", item_id=self.open["id"], output_index=len(self.output),
                               content_index=0,
                               part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        return out

    def _content(self, delta: str, logprobs: list[dict[str, Any]]) -> list[str]:
        out = []
        if self.open is None or self.open["type"] != "message":
            out += self._open_message()
        self.text.append(delta)
        self.lps += logprobs
        out.append(self._event("response.output_text.delta", item_id=self.open["id"], output_index=len(self.output),
                               content_index=0, delta=delta, logprobs=logprobs))
        return out

    def _reasoning(self, delta: str) -> list[str]:
        out = []
        if self.open is None or self.open["type"] != "reasoning":
            out += self._close()
            self.open = _reasoning_item("")
            self.text = []
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=self.open))
        self.text.append(delta)
        out.append(self._event("response.reasoning_text.delta", item_id=self.open["id"], output_index=len(self.output),
                               content_index=0, delta=delta))
        return out

    def _tool_call(self, tc: dict[str, Any]) -> list[str]:
        out = []
        k = tc.get("index", 0)
        fn = tc.get("function") or {}
        if k not in self.calls:
            out += self._close()
            item = _call_item({"id": tc.get("id") or f"call_{_hex()[:24]}",
                               "function": {"name": fn.get("name") or "", "arguments": ""}}, "in_progress")
            self.calls[k] = self.open = item
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=dict(item)))
        item = self.calls[k]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                   output_index=len(self.output), delta=fn["arguments"]))
        return out

    def _close(self) -> list[str]:
        """Finish the open output item and append it to the output."""
        item, self.open = self.open, None
        if item is None:
            return []
        idx = len(self.output)
        status, _ = _status(self.finish_reason)
        out = []
        if item["type"] == "message":
            text = "".join(self.text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": self.lps}
            out.append(self._event("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0,
                                   text=text, logprobs=self.lps))
            out.append(self._event("response.content_part.done", item_id=item["id"], output_index=idx,
                                   content_index=0, part=part))
            item = {**item, "status": status, "content": [part]}
        elif item["type"] == "reasoning":
            text = "".join(self.text)
            out.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=idx,
                                   content_index=0, text=text))
            item = _reasoning_item(text, item["id"])
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                                   arguments=item["arguments"]))
            item = {**item, "status": "completed"}
        out.append(self._event("response.output_item.done", output_index=idx, item=item))
        self.output.append(item)
        return out

    def _fail(self, error: dict[str, Any]) -> list[str]:
        self.failed = True
        rid = self.rid or f"resp-{_hex()}"
        out = [] if self.rid is not None else self._start(rid)
        out.append(self._event("error", code=error.get("code"), message=error.get("message", ""),
                               param=error.get("param")))
        obj = self.api.response_object(rid, self.req, self.created, "failed", self.output, _usage(self.usage),
                                       error={"code": "server_error", "message": error.get("message", "")})
        out.append(self._event("response.failed", response=obj))
        return out

    def content_text(self) -> str | None:
        texts = [c["text"] for it in self.output if it["type"] == "message" for c in it["content"]]
        return "".join(texts) if texts else None

    def reasoning(self) -> str | None:
        return "".join(c["text"] for it in self.output if it["type"] == "reasoning" for c in it["content"]) or None

    def tool_calls(self) -> list[dict[str, Any]]:
        return [{"id": it["call_id"], "function": {"name": it["name"], "arguments": it["arguments"]}}
                for it in self.output if it["type"] == "function_call"]

    def final(self) -> dict[str, Any]:
        """Close what is open (an empty reply still gets its message) and build the Response object."""
        self._pending = self._close()
        if not self.output:
            self._pending += self._open_message() + self._close()
        status, incomplete = _status(self.finish_reason)
        return self.api.response_object(self.rid or f"resp-{_hex()}", self.req, self.created, status, self.output,
                                        _usage(self.usage), incomplete)

    def finish(self, obj: dict[str, Any]) -> list[str]:
        kind = "response.completed" if obj["status"] == "completed" else "response.incomplete"
        return self._pending + [self._event(kind, response=obj)]

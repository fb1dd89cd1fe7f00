"""Parse and validate an OpenAI chat-completions body into a `ChatRequest`.

Everything a client can get wrong is checked here, before any token is
generated or anything is captured, and reported as an `APIError` in OpenAI's
error shape. Every parameter of OpenAI's chat API is either honoured or
refused by name (`UNSUPPORTED`); fields outside that API (other servers'
extensions) are ignored, wrong values of known fields are not.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
CLAWLOOP_FIELDS = ("session_id", "turn_type", "session_done", "return_token_ids")
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP = 4
MAX_LOGIT_BIAS = 300
UNSUPPORTED = {
    "audio": "audio output is not supported (text only)",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated 'functions' parameter is not supported: pass them as 'tools'",
    "function_call": "the deprecated 'function_call' parameter is not supported: use 'tool_choice'",
    "reasoning_effort": "this model has no reasoning-effort setting",
    "verbosity": "this model has no verbosity setting",
}
"""OpenAI chat parameters clawloop refuses (when set to anything but null) and why."""
INT64 = (-(2**63), 2**63 - 1)
MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""Largest image (decoded bytes) an `image_url` part may carry."""
MAX_IMAGE_PIXELS = 7680 * 4320
"""Largest image (width x height, read from its header before decoding) an `image_url` part may carry."""
MAX_IMAGES = 64
"""Most images one request may carry."""
IMAGE_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP",
                 "image/gif": "GIF"}
"""Data-URL media types accepted in `image_url` parts, and the PIL format each names."""
IMAGE_EXT = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif"}
IMAGE_REF = "clawloop-image://"
"""Captured messages keep an image part with its data URL replaced by `clawloop-image://<sha256>.<ext>`:
the file `<data_dir>/images/<sha256>.<ext>` holds the bytes the client sent."""
TEXT_ONLY = "this model takes text only"
GREEDY_BELOW = 1e-5
"""Temperatures under this sample greedily (as vLLM does): dividing logits by 1e-300 gives inf, then NaN."""
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


class APIError(Exception):
    """An error the API returns as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.message = message
        self.param = param
        self.code = code
        self.type = type or {400: "invalid_request_error", 401: "authentication_error",
                             404: "not_found_error", 413: "invalid_request_error", 429: "requests",
                             503: "server_error", 504: "timeout_error"}.get(
                                 status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_value(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    """Normalised: content is a string (or None), `developer` kept as its own role; a user or tool message
    with images keeps a list of parts: `{"type": "text", "text"}` and `{"type": "image_url", "image_url":
    {"url": "clawloop-image://<sha256>.<ext>"}}` (the reference `ImageInput.ref`)."""
    images: list["ImageInput"] = field(default_factory=list)
    """The images of the messages' image parts, in order of appearance (what the template renders)."""
    model: str = ""
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    """None for plain text; else `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {...}}`."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    min_tokens: int = 0
    """vLLM's extension: no stop (eos, stop ids) before this many tokens."""
    store: bool | None = None
    """`false`: the client asks that the exchange not be kept — it is not captured."""
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    """Routes the request like a session id (replicas keep a key on one warm prefix cache)."""
    safety_identifier: str | None = None
    """The end user, as the client names them: recorded on the turn (never a session id)."""
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    """vLLM's extension: continue the last (assistant) message instead of starting a new one."""
    # clawloop's session fields, when given in the body
    session_id: str | None = None
    turn_type: str | None = None
    session_done: bool = False
    user: str | None = None


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"We could not parse the JSON body of your request: {e}", code="invalid_json")
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(body):  # escaped pairs (emoji) are fine
        raise APIError(400, "We could not parse the JSON body of your request: it contains an unpaired UTF-16 "
                            "surrogate escape (\\uD800-\\uDFFF), which is not text.", code="invalid_json")
    return body


def _has_lone_surrogate(obj: Any) -> bool:
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(obj, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_lone_surrogate(v) for v in obj)
    return False


@dataclass(eq=False)
class ImageInput:
    """One image of a request, from an `image_url` part's data URL: the bytes as sent, checked to be an
    image of an accepted format and size (its header read; decoding the pixels is the engine's)."""

    data: bytes
    format: str
    """PIL's format name: PNG, JPEG, WEBP or GIF."""
    width: int
    height: int
    sha256: str
    param: str
    """Where the part was: `messages[i].content[j]`."""
    detail: str | None = None

    @property
    def filename(self) -> str:
        return f"{self.sha256}.{IMAGE_EXT[self.format]}"

    @property
    def ref(self) -> str:
        """What captured messages keep instead of the data URL."""
        return IMAGE_REF + self.filename


def parse_image_part(part: dict[str, Any], param: str) -> ImageInput:
    """An OpenAI `{"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail"}}` part
    as an `ImageInput`; a 400 naming the exact param for anything else (this server fetches no URLs)."""
    iu = part.get("image_url")
    if not isinstance(iu, dict):
        raise bad_value(f"Invalid type for '{param}.image_url': expected an object {{'url': 'data:image/png;base64,"
                        "...'}}.", param + ".image_url", code="invalid_type" if iu is not None else
                        "missing_required_parameter")
    p = param + ".image_url.url"
    url = iu.get("url")
    if not isinstance(url, str) or not url:
        raise bad_value(f"Missing required parameter: '{p}' (a data URL: data:image/png;base64,...).", p,
                        code="missing_required_parameter" if url is None else "invalid_type")
    detail = iu.get("detail")
    if detail is not None and detail not in ("auto", "low", "high"):
        raise bad_value(f"Invalid value for '{param}.image_url.detail': {detail!r} (auto, low or high).",
                        param + ".image_url.detail")
    if url[:5].lower() != "data:":
        shown = url if len(url) <= 80 else url[:77] + "..."
        raise bad_value(f"Invalid image URL at '{p}' ({shown!r}): this server does not fetch URLs; send the "
                           "image inline as a base64 data URL (data:image/png;base64,...).", p, "invalid_image_url")
    head, sep, payload = url[5:].partition(",")
    params = [x.strip().lower() for x in head.split(";")]
    mime = params[0]
    if not sep or "base64" not in params[1:]:
        raise bad_value(f"Invalid image URL at '{p}': expected a base64 data URL (data:<type>;base64,<data>).",
                           p, "invalid_image_url")
    if mime not in IMAGE_FORMATS:
        raise bad_value(f"Unsupported image type {mime!r} at '{p}': send image/png, image/jpeg, image/webp or "
                           "image/gif.", p, "invalid_image_format")
    if len(payload) > (MAX_IMAGE_BYTES + 2) // 3 * 4 + 64:  # refused before decoding
        raise bad_value(f"Image too large at '{p}': over {MAX_IMAGE_BYTES} bytes.", p, "image_too_large")
    try:
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error:  # line breaks or spaces in the payload (MIME-style): accepted
            data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise bad_value(f"Invalid image at '{p}': the data is not valid base64.", p, "image_parse_error") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise bad_value(f"Image too large at '{p}': {len(data)} bytes (limit {MAX_IMAGE_BYTES}).", p,
                           "image_too_large")
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:  # reads the header only
            fmt, (w, h) = im.format, im.size
    except Exception:  # PIL raises many kinds for bytes that are not an image
        raise bad_value(f"Invalid image at '{p}': the data is not a PNG, JPEG, WebP or GIF image.", p,
                           "image_parse_error") from None
    if fmt not in IMAGE_EXT:
        raise bad_value(f"Unsupported image format {fmt!r} at '{p}': send PNG, JPEG, WebP or GIF.", p,
                           "invalid_image_format")
    if w < 1 or h < 1 or w * h > MAX_IMAGE_PIXELS:
        raise bad_value(f"Image too large at '{p}': {w}x{h} pixels (limit {MAX_IMAGE_PIXELS} pixels).", p,
                           "image_too_large")
    return ImageInput(data=data, format=fmt, width=w, height=h, sha256=hashlib.sha256(data).hexdigest(),
                      param=param, detail=detail)


def _text_of(content: Any, param: str, *, images: bool | str = False, role: str = "user",
             found: list[ImageInput] | None = None) -> str | list[dict[str, Any]]:
    """Content as a string: a string, or a list of text parts joined. With `images` true, a user or tool
    message's `image_url` parts are parsed (appended to `found`) and such content stays a list of parts
    (text parts, and image parts whose URL is the image's `ref`). `images` false or a reason string:
    image parts are refused with that reason (false: the model takes text only)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[Any] = []
        has_image = False
        for j, part in enumerate(content):
            p = f"{param}[{j}]"
            if isinstance(part, str):
                parts.append(part)
                continue
            if not isinstance(part, dict) or "type" not in part:
                raise bad_value(f"Invalid content part at '{p}': expected an object with a 'type'.", p)
            if part["type"] in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise bad_value(f"Invalid content part at '{p}': 'text' must be a string.", p + ".text")
                parts.append(part["text"])
            elif part["type"] == "image_url" and images is True:
                if role not in ("user", "tool"):
                    raise bad_value(f"Unsupported content part type 'image_url' at '{p}': images are accepted in "
                                    "user and tool messages only.", p + ".type", code="unsupported_content")
                img = parse_image_part(part, p)
                if found is not None:
                    if len(found) >= MAX_IMAGES:
                        raise bad_value(f"Too many images: at most {MAX_IMAGES} per request ('{p}').", p)
                    found.append(img)
                iu: dict[str, Any] = {"url": img.ref}
                if img.detail is not None:
                    iu["detail"] = img.detail
                parts.append({"type": "image_url", "image_url": iu})
                has_image = True
            else:
                if part["type"] == "image_url":  # refused: `images` is false or says why
                    why = images if isinstance(images, str) else TEXT_ONLY
                else:
                    why = "this model takes text and images only" if images is True else TEXT_ONLY
                raise bad_value(f"Unsupported content part type {part['type']!r} at '{p}': {why}.",
                           p + ".type", code="unsupported_content")
        if not has_image:
            return "".join(parts)
        out: list[dict[str, Any]] = []
        for x in parts:  # adjacent text joined, as the text-only path joins it all
            if isinstance(x, str):
                if out and out[-1]["type"] == "text":
                    out[-1]["text"] += x
                else:
                    out.append({"type": "text", "text": x})
            else:
                out.append(x)
        return [x for x in out if x["type"] != "text" or x["text"]]
    raise bad_value(f"Invalid type for '{param}': expected a string or a list of text parts.", param,
               code="invalid_type")


def _normalize_tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_value(f"'{param}' must be a list.", param, code="invalid_type")
    out = []
    for j, c in enumerate(calls):
        p = f"{param}[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_value(f"Invalid tool call at '{p}': expected {{'type': 'function', 'function': {{'name', "
                       "'arguments'}}}}.", p)
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise bad_value(f"'{p}.function.arguments' must be a JSON string.", p + ".function.arguments")
        out.append({"id": c.get("id") or f"call_{j}", "type": "function",
                    "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def normalize_messages(messages: Any, *, images: bool | str = False,
                       found: list[ImageInput] | None = None) -> list[dict[str, Any]]:
    """Messages checked and normalised (see `ChatRequest.messages`). `images`: true when the served model
    takes image parts (their images are appended to `found`), else the reason they are refused (false:
    the model takes text only)."""
    if messages is None:
        raise bad_value("Missing required parameter: 'messages'.", "messages", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise bad_value("Invalid type for 'messages': expected an array.", "messages", code="invalid_type")
    if not messages:
        raise bad_value("'messages' must contain at least one message.", "messages", code="empty_array")
    out = []
    answering: str | None = None  # the role before the current run of tool messages
    owed: dict[str, int] = {}  # tool_call_id -> index of the assistant message that made the call
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_value(f"Invalid type for '{p}': expected an object.", p, code="invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_value(f"Invalid value for '{p}.role': {role!r}. Supported roles: {', '.join(ROLES)}.",
                       p + ".role")
        if role != "tool":
            _check_answered(owed)
            answering = role
        elif answering != "assistant":
            # Only a tool result that answers the assistant may come in (OpenAI asks for the assistant's
            # `tool_calls`; an assistant that wrote its call as text, as raw Hermes clients do, is accepted).
            raise bad_value(f"Invalid value for '{p}.role': messages with role 'tool' must be a response to a "
                       "preceding assistant message with 'tool_calls'.", p + ".role")
        msg: dict[str, Any] = {"role": role}
        content = m.get("content")
        if role == "assistant":
            msg["content"] = None if content is None else _text_of(content, p + ".content", images=images,
                                                                   role=role)
            if m.get("tool_calls"):
                msg["tool_calls"] = _normalize_tool_calls(m["tool_calls"], p + ".tool_calls")
                owed = {str(c["id"]): i for c in m["tool_calls"] if isinstance(c, dict) and c.get("id")}
            if msg["content"] is None and "tool_calls" not in msg:
                msg["content"] = ""
            # A thinking model's earlier reasoning, sent back (vLLM/SGLang name it `reasoning_content`, newer
            # vLLM `reasoning`): the chat template decides whether it is rendered (Qwen3 keeps it only after
            # the last user message). Linking never looks at it, so keeping or dropping it links the same.
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise bad_value(f"Invalid type for '{p}.reasoning_content': expected a string.",
                                    p + ".reasoning_content", code="invalid_type")
                msg["reasoning_content"] = reasoning
        else:
            if content is None:
                raise bad_value(f"Missing required parameter: '{p}.content'.", p + ".content",
                           code="missing_required_parameter")
            msg["content"] = _text_of(content, p + ".content", images=images, role=role, found=found)
        if role == "tool":
            if m.get("tool_call_id") is not None:
                msg["tool_call_id"] = str(m["tool_call_id"])
            if owed or (out and out[-1].get("tool_calls") and "tool_call_id" not in msg):
                # answering structured calls (as OpenAI checks): each id once, each a call that was made
                tid = msg.get("tool_call_id")
                if tid is None:
                    raise bad_value(f"Missing required parameter: '{p}.tool_call_id'.", p + ".tool_call_id",
                               code="missing_required_parameter")
                if tid not in owed:
                    raise bad_value(f"Invalid parameter: '{p}.tool_call_id' {tid!r} does not answer a tool call of the "
                               "preceding assistant message (or answers it twice).", p + ".tool_call_id")
                del owed[tid]
            if m.get("name") is not None:
                msg["name"] = str(m["name"])
        elif isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    if owed and out[-1]["role"] == "tool":
        _check_answered(owed)
    return out


def _check_answered(owed: dict[str, int]) -> None:
    if owed:
        j = next(iter(owed.values()))
        raise bad_value(f"An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                   f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                   f"{', '.join(owed)}.", f"messages[{j}].tool_calls")


def _normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_value("Invalid type for 'tools': expected an array.", "tools", code="invalid_type")
    out = []
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise bad_value(f"Invalid value for '{p}.type': only 'function' tools are supported.", p + ".type")
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_value(f"Missing required parameter: '{p}.function.name'.", p + ".function.name",
                       code="missing_required_parameter")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise bad_value(f"Invalid type for '{p}.function.parameters': expected a JSON schema object.",
                       p + ".function.parameters", code="invalid_type")
        out.append({"type": "function", "function": fn})
    names = [t["function"]["name"] for t in out]
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise bad_value(f"Invalid value for 'tools[{i}].function.name': {n!r} is offered twice.",
                       f"tools[{i}].function.name")
    return out or None


def _response_format(body: dict) -> dict[str, Any] | None:
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_value("Invalid value for 'response_format': expected {'type': 'text' | 'json_object' | "
                   "'json_schema'}.", "response_format")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("name"), str) or not js["name"]:
            raise bad_value("Missing required parameter: 'response_format.json_schema.name'.",
                       "response_format.json_schema.name", code="missing_required_parameter")
        schema = js.get("schema", {})
        if not isinstance(schema, dict):
            raise bad_value("Invalid type for 'response_format.json_schema.schema': expected a JSON schema object.",
                       "response_format.json_schema.schema", code="invalid_type")
        return {"type": "json_schema", "json_schema": {**js, "schema": schema}}
    return {"type": "json_object"}


def _logit_bias(body: dict) -> dict[int, float] | None:
    lb = body.get("logit_bias")
    if lb is None:
        return None
    if not isinstance(lb, dict):
        raise bad_value("Invalid type for 'logit_bias': expected an object mapping token ids to biases.", "logit_bias",
                   code="invalid_type")
    if len(lb) > MAX_LOGIT_BIAS:
        raise bad_value(f"Invalid value for 'logit_bias': at most {MAX_LOGIT_BIAS} entries.", "logit_bias")
    out: dict[int, float] = {}
    for k, v in lb.items():
        if not (isinstance(k, str) and k.strip().lstrip("-").isdigit()) or int(k) < 0:
            raise bad_value(f"Invalid key in 'logit_bias': {k!r} is not a token id.", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad_value(f"Invalid value in 'logit_bias' for {k}: {v!r} (a number from -100 to 100).", "logit_bias")
        out[int(k)] = float(v)
    return out or None


def number_field(body: dict, key: str, lo: float, hi: float, default: Any, *, integer: bool = False,
            lo_open: bool = False) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not float(v).is_integer()):
        raise bad_value(f"Invalid type for '{key}': expected {'an integer' if integer else 'a number'}.", key,
                   code="invalid_type")
    if v < lo or v > hi or (lo_open and v == lo):
        lo_s = f"> {lo}" if lo_open else f">= {lo}"
        raise bad_value(f"Invalid value for '{key}': {v} is out of range (must be {lo_s} and <= {hi}).", key)
    return int(v) if integer else float(v)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_value(f"Invalid type for '{key}': expected a boolean.", key, code="invalid_type")
    return v


def parse_sampling(body: dict[str, Any]) -> tuple[float, float, list[str], int | None]:
    """`temperature` (tiny ones mean greedy: 0), `top_p`, `stop` and `seed`, as chat and completions
    both take them."""
    temperature = number_field(body, "temperature", 0.0, 2.0, 1.0)
    if temperature < GREEDY_BELOW:
        temperature = 0.0
    top_p = number_field(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)
    stops: list[str] = []
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_value("Invalid value for 'stop': expected a non-empty string or an array of them.", "stop")
        if len(stops) > MAX_STOP:
            raise bad_value(f"Invalid value for 'stop': at most {MAX_STOP} sequences.", "stop")
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise bad_value("Invalid type for 'seed': expected an integer.", "seed", code="invalid_type")
        if not INT64[0] <= seed <= INT64[1]:
            raise bad_value(f"Invalid value for 'seed': {seed} is out of range (a 64-bit signed integer).", "seed")
    return temperature, top_p, list(stops), seed


def parse_chat_request(body: dict[str, Any], max_model_len: int, *, images: bool | str = False) -> ChatRequest:
    """`images`: true when the served model takes image parts, else why not (false: it takes text only)."""
    for key, why in UNSUPPORTED.items():
        if body.get(key) is not None:
            raise bad_value(f"Unsupported parameter: '{key}': {why}.", key, code="unsupported_parameter")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_value("Unsupported value for 'modalities': this model produces text only (['text']).", "modalities",
                   code="unsupported_parameter")
    found: list[ImageInput] = []
    req = ChatRequest(messages=normalize_messages(body.get("messages"), images=images, found=found), images=found)
    model = body.get("model", "")
    if not isinstance(model, str):
        raise bad_value("Invalid type for 'model': expected a string.", "model", code="invalid_type")
    req.model = model
    req.tools = _normalize_tools(body.get("tools"))
    tc = body.get("tool_choice", "auto")
    if tc is None:
        tc = "auto"
    if isinstance(tc, str):
        if tc not in ("auto", "none", "required"):
            raise bad_value(f"Invalid value for 'tool_choice': {tc!r}.", "tool_choice")
    elif not (isinstance(tc, dict) and isinstance(tc.get("function"), dict) and tc["function"].get("name")):
        raise bad_value("Invalid value for 'tool_choice': expected 'auto', 'none', 'required' or "
                   "{'type': 'function', 'function': {'name'}}.", "tool_choice")
    if tc != "auto" and tc != "none" and not req.tools:
        raise bad_value("'tool_choice' is set but no 'tools' were given.", "tool_choice")
    if isinstance(tc, dict) and tc["function"]["name"] not in [t["function"]["name"] for t in req.tools or ()]:
        raise bad_value(f"Invalid value for 'tool_choice': no tool named {tc['function']['name']!r} was offered.",
                   "tool_choice")
    req.tool_choice = tc
    req.parallel_tool_calls = _bool(body, "parallel_tool_calls", True)
    req.response_format = _response_format(body)
    req.stream = _bool(body, "stream")
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad_value("Invalid type for 'stream_options': expected an object.", "stream_options",
                       code="invalid_type")
        if not req.stream:
            raise bad_value("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        req.include_usage = bool(so.get("include_usage", False))
    req.n = number_field(body, "n", 1, MAX_N, 1, integer=True)
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    if mt is not None:
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        req.max_tokens = number_field({key: mt}, key, 1, max_model_len, 0, integer=True)
    req.temperature, req.top_p, req.stop, req.seed = parse_sampling(body)
    req.logprobs = _bool(body, "logprobs")
    req.top_logprobs = number_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, 0, integer=True)
    if req.top_logprobs and not req.logprobs:
        raise bad_value("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    req.presence_penalty = number_field(body, "presence_penalty", -2.0, 2.0, 0.0)
    req.frequency_penalty = number_field(body, "frequency_penalty", -2.0, 2.0, 0.0)
    req.logit_bias = _logit_bias(body)
    req.min_tokens = number_field(body, "min_tokens", 0, req.max_tokens or max_model_len, 0, integer=True)
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise bad_value("Invalid type for 'store': expected a boolean.", "store", code="invalid_type")
    req.store = store
    md = body.get("metadata")
    if md is not None:
        if (not isinstance(md, dict) or len(md) > 16
                or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                           for k, v in md.items())):
            raise bad_value("Invalid value for 'metadata': at most 16 string keys (<= 64 chars) with string values "
                       "(<= 512 chars).", "metadata")
        req.metadata = dict(md)
    tier = body.get("service_tier")
    if tier is not None and tier not in ("auto", "default"):
        raise bad_value(f"Unsupported value for 'service_tier': {tier!r}: this server has one tier ('auto' or "
                   "'default').", "service_tier", code="unsupported_parameter")
    req.service_tier = tier
    for key in ("prompt_cache_key", "safety_identifier"):
        v = body.get(key)
        if v is not None and not isinstance(v, str):
            raise bad_value(f"Invalid type for '{key}': expected a string.", key, code="invalid_type")
    req.prompt_cache_key = body.get("prompt_cache_key") or None
    req.safety_identifier = body.get("safety_identifier") or None
    if body.get("prompt_cache_retention") not in (None, "in-memory", "in_memory"):
        raise bad_value("Unsupported value for 'prompt_cache_retention': prompts are cached in memory only.",
                   "prompt_cache_retention", code="unsupported_parameter")
    req.return_token_ids = _bool(body, "return_token_ids")
    req.continue_final_message = _bool(body, "continue_final_message")
    agp = _bool(body, "add_generation_prompt", True)
    req.add_generation_prompt = agp and not req.continue_final_message
    if req.continue_final_message:
        if agp and "add_generation_prompt" in body:
            raise bad_value("'continue_final_message' needs 'add_generation_prompt': false.", "add_generation_prompt")
        if req.messages[-1]["role"] != "assistant":
            raise bad_value("'continue_final_message' needs the last message to be the assistant's.",
                       "continue_final_message")
    sid = body.get("session_id")
    if sid is not None and not isinstance(sid, str):
        raise bad_value("Invalid type for 'session_id': expected a string.", "session_id", code="invalid_type")
    req.session_id = sid or None
    tt = body.get("turn_type")
    if tt is not None and tt not in ("main", "side"):
        raise bad_value(f"Invalid value for 'turn_type': {tt!r} (main or side).", "turn_type")
    req.turn_type = tt
    sd = body.get("session_done", False)
    req.session_done = sd in (True, 1, "1", "true")
    user = body.get("user")
    req.user = user if isinstance(user, str) and user else None
    return req

"""The OpenAI-compatible gateway: FastAPI in front of an `Engine`, with capture. The routes live
here and only here; each generation endpoint is its own module over the serving base
(serving.py: the shared `Gateway`, admission, token accumulation, one request's lifecycle), as
vLLM's `serving_chat.py` / `serving_completion.py` sit on `serving_engine.py`.

    app = create_app(cfg, engine, store)      # store=None: no capture
    uvicorn.run(app, host=cfg.serve.host, port=cfg.serve.port)

Routes: POST /v1/chat/completions (chat.py, streaming and not), POST /v1/completions
(completions.py), POST/GET/DELETE /v1/responses (responses.py, served through chat.py's
`run_chat`), POST /v1/messages[/count_tokens] (messages.py, Anthropic's Messages API, also through
`run_chat`; its errors in Anthropic's shape), GET /v1/models[/{id}], GET /health, GET /metrics, and
the web dashboard at / with its /api/* (dashboard.py).
Errors use OpenAI's shape. Extension fields a
trainer-side client may send: `return_token_ids: true` adds the prompt ids,
each choice's sampled ids and logprobs and the policy version to the reply;
`session_id`, `turn_type`, `session_done` mirror the X-Session-* headers.
Every reply carries `X-Policy-Version`: the version of the tokens sent. A
stream's headers leave before its first token exists, so there (and in the
role chunk's `policy_version`) it is the engine's version when the request was
accepted; every later chunk's `system_fingerprint` is the version of the
tokens it carries, and the finish chunk (with `return_token_ids`) the turn's.

API keys are tenants (`--api-key NAME=KEY`): the tenant's name goes on every
turn it captures and its session ids are namespaced (`NAME/SESSION`), so one
tenant can neither link into nor read another's sessions.

Limits answer in OpenAI's error shape: a full generation queue or an
overloaded store is a 429 with `Retry-After`, a request past
`serve.request_timeout_s` a 504 (generation aborted, what was generated kept
as an aborted turn), an unexpected failure a 500 whose body carries only a
request id that the server log also has.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import uuid
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from clawloop.config import ConfigError
from clawloop.engines.base import Engine, ReportsHealth
from clawloop.gateway import gcpause
from clawloop.gateway.chat import serve_chat
from clawloop.gateway.completions import serve_completions
from clawloop.gateway.dashboard import mount_dashboard
from clawloop.gateway.messages import anthropic_error, count_tokens, serve_messages
from clawloop.gateway.protocol import APIError
from clawloop.gateway.responses import ResponsesAPI
from clawloop.gateway.serving import Gateway, StatsFn
from clawloop.store import Store

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_keys: list[str], insecure: bool) -> None:
    """Refuse to expose an unauthenticated server beyond this machine."""
    if not is_loopback(host) and not api_keys and not insecure:
        raise ConfigError(
            f"serve.host: binding {host} exposes the API beyond this machine without an API key; "
            "pass --api-key KEY (or OPENCLAW_API_KEY), or --insecure if you really mean it")


def create_app(cfg: Any, engine: Engine, store: Store | None = None, *, stats: list[StatsFn] | None = None,
               manage_engine: bool = True, background: list[Callable[[], Any]] | None = None) -> FastAPI:
    """The gateway app. `store=None` serves without capture. With
    `manage_engine` the app starts and stops the engine in its lifespan.
    `background` coroutine factories run beside the server (judge, trainer)."""
    gw = Gateway(cfg, engine, store, stats=stats)
    background = list(background or [])  # the dashboard's history sampler joins them below

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine:
            await engine.start()
        tasks = []
        if gw.capture is not None:
            tasks.append(asyncio.create_task(gw.capture.run_sweeper()))
        for factory in background:
            tasks.append(asyncio.create_task(factory()))
        if cfg.serve.gc_freeze:
            log.info("gc: %d objects alive after start put out of the collector's way", gcpause.freeze())
        try:
            yield
        finally:
            if cfg.serve.gc_freeze:  # collectable again (a process that serves twice, as tests do)
                gcpause.unfreeze()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
            if store is not None:
                await asyncio.get_running_loop().run_in_executor(None, store.flush)
            if manage_engine:
                await engine.stop()

    app = FastAPI(title="clawloop", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw

    def error_reply(request: Request, e: APIError) -> JSONResponse:
        """An error in the shape of the API asked: Anthropic's under /v1/messages, else OpenAI's."""
        status, body = (anthropic_error(e) if request.url.path.startswith("/v1/messages")
                        else (e.status, e.body()))
        return JSONResponse(body, status_code=status, headers=e.headers or None)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        gw.metrics.observe_request(e.status, 0.0, 0, getattr(request.state, "tenant", ""))
        return error_reply(request, e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if e.status_code == 404 else None
        msg = f"Unknown route {request.method} {request.url.path}" if e.status_code == 404 else str(e.detail)
        return error_reply(request, APIError(e.status_code, msg, code=code))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        # The exception's text may hold anything (paths, prompts, keys): it goes to the log, under an id
        # the client gets instead.
        rid = f"req_{uuid.uuid4().hex[:24]}"
        log.exception("request %s (%s %s) failed", rid, request.method, request.url.path)
        gw.metrics.observe_request(500, 0.0, 0, getattr(request.state, "tenant", ""))
        err = APIError(500, f"The server had an error processing your request (request id {rid}); the server "
                            "log has the details.", code="internal_error", headers={"X-Request-Id": rid})
        return error_reply(request, err)

    responses_api = ResponsesAPI(gw)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve_chat(gw, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve_completions(gw, request)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await serve_messages(gw, request)

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(request: Request) -> Response:
        return await count_tokens(gw, request)

    @app.post("/v1/responses")
    async def responses_create(request: Request) -> Response:
        return await responses_api.create(request)

    @app.get("/v1/responses/{response_id}")
    async def responses_get(request: Request, response_id: str) -> Response:
        return await responses_api.retrieve(request, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def responses_delete(request: Request, response_id: str) -> Response:
        return await responses_api.delete(request, response_id)

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> JSONResponse:
        gw.check_auth(request)
        if model_id != cfg.serve.served_model_name:
            raise APIError(404, f"The model '{model_id}' does not exist.", param="model", code="model_not_found",
                           type="invalid_request_error")
        return JSONResponse({"id": model_id, "object": "model", "created": int(gw.started_at),
                             "owned_by": "clawloop", "policy_version": engine.policy_version})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        gw.check_auth(request)
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.serve.served_model_name, "object": "model", "created": int(gw.started_at),
            "owned_by": "clawloop", "policy_version": engine.policy_version}]})

    @app.get("/health")
    async def health() -> JSONResponse:
        body: dict[str, Any] = {"status": "ok", "policy_version": engine.policy_version, "inflight": gw.inflight}
        if isinstance(engine, ReportsHealth):  # engines with replicas: each one's state; degraded when one is down
            body.update(engine.health())
            body["policy_version"] = engine.policy_version
        stats = gw.all_stats()
        gate = {k[len("gate/"):]: v for k, v in stats.items() if k.startswith("gate/")}
        if "train/busy" in stats:  # the trainer: stepping now, or waiting for `batch_size` samples with a signal
            body["train"] = {"busy": bool(stats["train/busy"]), "step": int(stats.get("train/step", 0)),
                             "pending_samples": int(stats.get("train/pending_samples", 0)),
                             "batch_size": int(stats.get("train/batch_size", 0))}
        if gate:  # the trainer's publish gate (trainer/gate.py): what it checked, refused, scored
            body["gate"] = gate
        code = 503 if body["status"] == "unavailable" else 200
        return JSONResponse(body, status_code=code, headers={"X-Policy-Version": str(engine.policy_version)})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if cfg.serve.metrics_auth:
            gw.check_auth(request)
        data, ctype = gw.metrics.render()
        return Response(data, media_type=ctype)

    background.append(mount_dashboard(app, gw))  # the page at / and its /api/*
    return app

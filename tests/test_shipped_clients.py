"""Real clients against `clawloop serve` of the model a new user gets (the shipped tiny model, no
`--model-path`), as a user calls them: LangChain's named tool choice and `with_structured_output`
(json_schema and function_calling) and the OpenAI Agents SDK, with `max_tokens=48` and schemas
with no bounds (free strings, integers). The gateway constrains decoding to the schema; the shipped
model alone does not close its objects (issue #28: it writes digits until max_tokens, 0/10 of these
calls succeeded before), so in the last `serve.close_json_tokens` (16) tokens of the budget the hf
engine takes the likeliest allowed token that closes the JSON or moves on to a required member
(engines/grammar.py): LangChain's calls get valid objects, whose values are whatever the model wrote.
`tests/test_clients.py` covers the same clients on a random model with bounded schemas.

The Agents SDK run passes since the long-prompt bare-facts build shipped (2026-11-28): after its forced
first call the model takes the final JSON. The build before it went on calling the tool until the
SDK's max_turns (this test was a strict xfail then)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest
from pydantic import BaseModel

from conftest import free_port

SEEDS = range(6)
"""Sampled calls per client method (temperature 1, the default), each with its own seed, plus one greedy."""


class Sum(BaseModel):
    answer: int


class Verdict(BaseModel):
    correct: bool
    reason: str


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`clawloop serve` on the default (shipped) model: its own process, stopped by PID."""
    data = tmp_path_factory.mktemp("shipped")
    port = free_port()
    log = open(data / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "serve", "--data-dir", str(data),
                             "--port", str(port), "--host", "127.0.0.1"],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, (data / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "serve did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _chat_model(url, seed=None):
    from langchain_openai import ChatOpenAI

    kw = {"temperature": 0} if seed is None else {"seed": seed}
    return ChatOpenAI(model="clawloop", base_url=url + "/v1", api_key="none", max_retries=0, max_tokens=48, **kw)


def _tally(call) -> tuple[int, list[str]]:
    """How many of the greedy call and the seeded ones succeed; what the failures raised."""
    ok, errors = 0, []
    for seed in [None, *SEEDS]:
        try:
            call(seed)
            ok += 1
        except Exception as e:  # a client's own error for an object cut at max_tokens, or an assertion
            errors.append(f"seed {seed}: {type(e).__name__}: {str(e)[:120]}")
    return ok, errors


CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                        "required": ["expression"]}}}


def test_langchain_named_tool_choice_on_the_shipped_model(served):
    def call(seed):
        msg = _chat_model(served, seed).bind_tools([CALC], tool_choice="calculator").invoke("What is 12+7?")
        (tc,) = msg.tool_calls
        assert tc["name"] == "calculator" and isinstance(tc["args"]["expression"], str)
    ok, errors = _tally(call)
    assert ok >= len(SEEDS), errors  # the greedy call and all but one sampled


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_on_the_shipped_model(served, method):
    def call(seed):
        out = _chat_model(served, seed).with_structured_output(Sum, method=method).invoke("What is 12+7?")
        assert isinstance(out, Sum)
    ok, errors = _tally(call)
    assert ok >= len(SEEDS), errors
    # an object with a free string in it ends too
    out = _chat_model(served).with_structured_output(Verdict, method=method).invoke("Is 12+7 19?")
    assert isinstance(out, Verdict)


def test_agents_sdk_on_the_shipped_model(served):
    """The Agents SDK's default Responses model: the first turn must call the tool (required), the
    tool's result goes back, and the run ends with a typed final output within max_tokens 48."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        calls.append(expression)
        return "19"

    async def go():
        client = openai.AsyncOpenAI(base_url=served + "/v1", api_key="none", max_retries=0)
        try:
            agent = Agent(name="calc", instructions="Use the calculator, then answer.",
                          model=OpenAIResponsesModel(model="clawloop", openai_client=client), tools=[calculator],
                          model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
                          output_type=Sum)
            return await Runner.run(agent, "What is 12+7?", max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(go())
    assert len(calls) >= 1 and isinstance(result.final_output, Sum)
    kinds = [it.type for it in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    json.dumps(result.final_output.model_dump())

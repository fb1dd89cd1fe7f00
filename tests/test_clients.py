"""Real clients, unchanged, against a real server on loopback (one for the module) with the random
tiny model: the official `openai` SDK (sync, async, streaming, tools, structured output, typed
errors, the Responses API), LangChain's `ChatOpenAI`, and the OpenAI Agents SDK with both its
chat-completions and its Responses model. The clients are the versions pyproject's `dev` extra pins
(the newest the registry has).

A random model writes nothing valid on its own: every tool call and structured object here is
valid because the gateway constrains decoding to the offered tools and the requested schema.
Every schema here is bounded (enums, booleans, strings with `maxLength`): a valid object then
ends within the token budget on any sampling path, greedy included (a random model's greedy
integer is `2222…` forever). Agents runs use temperature 0, so each takes the same path every time."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from conftest import Gateway

Q = [{"role": "user", "content": "What is 12+7?"}]
CALC_PARAMS = {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 8}},
               "required": ["expression"], "additionalProperties": False}
CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                         "parameters": CALC_PARAMS}}
CALC_FLAT = {"type": "function", "name": "calculator", "description": "Evaluate arithmetic.",
             "parameters": CALC_PARAMS, "strict": True}


class Answer(BaseModel):
    verdict: Literal["yes", "no"]
    sure: bool
    note: str = Field(max_length=4)


def calc_args_ok(arguments: str | dict) -> bool:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return set(args) == {"expression"} and isinstance(args["expression"], str) and len(args["expression"]) <= 8


@pytest.fixture(scope="module")
def gw(engine, random_model_dir, tmp_path_factory):
    g = Gateway(engine, random_model_dir, tmp_path_factory.mktemp("clients"))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def client(gw):
    return gw.client()


def aclient(gw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)


def turn_of(gw, request_id: str):
    gw.store.flush()
    for _, turns in gw.store.iter_sessions():
        for t in turns:
            if t.request_id == request_id:
                return t
    raise AssertionError(f"no captured turn for {request_id}")


# -- openai SDK ------------------------------------------------------------------------

def test_openai_async_chat_and_stream(gw):
    async def run():
        c = aclient(gw)
        r = await c.chat.completions.create(model="m", messages=Q, max_tokens=8, seed=3)
        stream = await c.chat.completions.create(model="m", messages=Q, max_tokens=8, seed=3, stream=True)
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
        await c.close()
        return r, text
    r, text = asyncio.run(run())
    assert r.choices[0].message.content == text and r.usage.completion_tokens <= 8


def test_openai_tool_call_is_made_to_an_offered_tool(client):
    r = client.chat.completions.create(model="m", messages=Q, tools=[CALC], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=120, seed=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    (call,) = ch.message.tool_calls
    assert call.function.name == "calculator" and calc_args_ok(call.function.arguments) and call.id


def test_openai_parse_returns_a_validated_object(client):
    r = client.chat.completions.parse(model="m", messages=Q, response_format=Answer, max_tokens=200, seed=1)
    assert isinstance(r.choices[0].message.parsed, Answer), r.choices[0].message.content


def test_openai_errors_are_typed_with_status_and_param(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=Q, top_p=0)
    assert e.value.status_code == 400 and e.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x", suffix="y")
    assert e.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp-doesnotexist")


# -- Responses API through the openai SDK -----------------------------------------------

def test_responses_function_call_then_its_output_via_previous_response_id(gw, client):
    r1 = client.responses.create(model="m", input="What is 12+7?", tools=[CALC_FLAT], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=120, temperature=0)
    assert r1.status == "completed"
    (call,) = [it for it in r1.output if it.type == "function_call"]
    assert call.name == "calculator" and calc_args_ok(call.arguments) and call.call_id
    r2 = client.responses.create(model="m", previous_response_id=r1.id, tools=[CALC_FLAT], tool_choice="none",
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "19"}],
                                 max_output_tokens=6)
    assert r2.output[0].type == "message"
    t1, t2 = turn_of(gw, r1.id), turn_of(gw, r2.id)
    assert t2.session_id == t1.session_id and t2.index == t1.index + 1
    assert t2.messages[-1]["role"] == "tool" and t2.messages[-1]["content"] == "19"
    assert t1.next_state["content"] == "19"


def test_responses_stream_a_tool_call(client):
    events = list(client.responses.create(model="m", input="What is 12+7?", tools=[CALC_FLAT],
                                          tool_choice="required", parallel_tool_calls=False,
                                          max_output_tokens=120, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
    assert added.item.name == "calculator"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done.arguments == deltas and calc_args_ok(done.arguments) and done.item_id == added.item.id
    final = events[-1].response
    assert [it.type for it in final.output] == ["function_call"] and final.output[0].arguments == done.arguments


def test_responses_structured_output_parse_and_stream(client):
    r = client.responses.parse(model="m", input="Is 12+7 19?", text_format=Answer, max_output_tokens=200,
                               temperature=0)
    assert r.status == "completed" and isinstance(r.output_parsed, Answer), r.output_text
    with client.responses.stream(model="m", input="Is 2+2 4?", text_format=Answer, max_output_tokens=200,
                                 temperature=0) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert isinstance(final.output_parsed, Answer) and "".join(deltas) == final.output_text


# -- LangChain ------------------------------------------------------------------------

def _chat_model(gw, **kw):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="clawloop", base_url=gw.url + "/v1", api_key="none", max_retries=0, temperature=0,
                      **kw)


def test_langchain_invoke_and_stream(gw):
    # 32 tokens, not 8: deltas that are ready together go out as one chunk, and on a loaded machine the
    # random model's 8 tokens came in one (a flake seen once in a full `make test`)
    llm = _chat_model(gw, max_tokens=32)
    msg = llm.invoke("What is 12+7?")
    assert isinstance(msg.content, str) and msg.content and msg.usage_metadata["output_tokens"] <= 32
    chunks = list(llm.stream("What is 12+7?"))
    assert "".join(c.content for c in chunks) == msg.content  # greedy: the same reply
    assert len([c for c in chunks if c.content]) >= 2


def test_langchain_bind_tools_calls_the_tool(gw):
    llm = _chat_model(gw, max_tokens=120).bind_tools([CALC], tool_choice="calculator", parallel_tool_calls=False)
    msg = llm.invoke("What is 12+7?")
    (call,) = msg.tool_calls
    assert call["name"] == "calculator" and calc_args_ok(call["args"]) and call["id"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(gw, method):
    out = _chat_model(gw, max_tokens=200).with_structured_output(Answer, method=method).invoke("Is 12+7 19?")
    assert isinstance(out, Answer)


# -- OpenAI Agents SDK ------------------------------------------------------------------

def _agent(model, calls: list, **kw):
    from agents import Agent, ModelSettings, function_tool

    @function_tool
    def calculator(expression: Annotated[str, Field(max_length=8)]) -> str:
        """Evaluate arithmetic."""
        calls.append(expression)
        return "19"

    settings = ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200)
    return Agent(name="calc", instructions="Use the calculator, then answer.", model=model, tools=[calculator],
                 model_settings=settings, **kw)


def _run(agent, client: openai.AsyncOpenAI, **kw):
    from agents import Runner, set_tracing_disabled

    set_tracing_disabled(True)  # nothing outside is reachable; no trace export

    async def go():
        try:
            return await Runner.run(agent, "What is 12+7?", max_turns=4, **kw)
        finally:
            await client.close()
    return asyncio.run(go())


def test_agents_chat_completions_model_calls_the_tool_and_answers(gw):
    from agents import OpenAIChatCompletionsModel

    calls: list = []
    c = aclient(gw)
    result = _run(_agent(OpenAIChatCompletionsModel(model="clawloop", openai_client=c), calls), c)
    # `required` forces the first turn's call; the SDK then resets tool_choice and the model answers in text
    assert len(calls) == 1 and isinstance(calls[0], str) and len(calls[0]) <= 8
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [it.type for it in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"


def test_agents_responses_model_calls_the_tool_and_answers(gw):
    """The default (Responses) model, chaining turns with previous_response_id; the final answer is a
    structured one, so the model's reply after the tool result ends (a random model's free text would
    run into max_output_tokens, which the Responses API reports as an incomplete response)."""
    from agents import OpenAIResponsesModel

    calls: list = []
    c = aclient(gw)
    agent = _agent(OpenAIResponsesModel(model="clawloop", openai_client=c), calls, output_type=Answer)
    result = _run(agent, c, auto_previous_response_id=True)
    assert len(calls) >= 1 and all(isinstance(c, str) and len(c) <= 8 for c in calls)
    assert isinstance(result.final_output, Answer)
    ids = [r.response_id for r in result.raw_responses]
    assert len(ids) >= 2 and all(ids)
    stored = gw.client().responses.retrieve(ids[-1])
    assert stored.previous_response_id == ids[-2]  # the SDK sent only the new items
    first, last = turn_of(gw, ids[0]), turn_of(gw, ids[-1])
    assert last.session_id == first.session_id  # one session, linked by previous_response_id
    assert any(m["role"] == "tool" for m in last.messages)


def test_clients_are_the_pinned_versions():
    """The clients tested here are those pyproject pins (kept at the registry's newest): a venv left on
    older ones would test something no new user runs."""
    import re
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    dev = project["optional-dependencies"]["dev"]
    pins = dict(m.groups() for d in dev if (m := re.fullmatch(r"([a-z-]+)==([\w.]+)", d)))
    for name in ("langchain-openai", "langchain-core", "openai-agents"):
        assert version(name) == pins[name], f"{name} {version(name)} installed, {pins[name]} pinned"

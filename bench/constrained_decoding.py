"""Constrained decoding on the hf engine: what the grammar costs per token, and what it buys.

Two measurements, one process, the engine driven directly (no HTTP, so the figures are the
engine's), prompts rendered and constraints built exactly as the gateway does:

- cost: the same JSON-schema requests generated with and without the constraint, alternating
  run by run (`--rounds`), at concurrency 1 and 8; ms per generated token (median over
  rounds), their ratio, and xgrammar's own mask-fill time per constrained token.
- validity on `--prompts` prompts (default 200) per task, each sampled once at temperature
  0.7 with and without the constraint:
  * tools: a calculator and a weather tool offered (`tool_choice: auto`, one call); a reply
    counts as a call when it opens `<tool_call>`, and as a valid call when the call parses, names
    an offered tool and its arguments match that tool's schema;
  * json: `response_format` json_schema (a name, an age and a yes/no); valid when the reply
    parses and matches the schema.

    .venv/bin/python bench/constrained_decoding.py [--model DIR] [--prompts 200] [--rounds 5]

Without --model the tiny model (`clawloop tiny-model`) is used when built, else a random model
of its shape. Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from clawloop.engines.base import GenerationRequest, SamplingParams
from clawloop.engines.hf import HFEngine
from clawloop.gateway.constraints import build_constraint
from clawloop.gateway.protocol import parse_chat_request
from clawloop.gateway.parsers import HermesToolParser, ToolStream
from clawloop.gateway.render import renderer_for

CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                         "parameters": {"type": "object", "properties": {
                                             "expression": {"type": "string", "maxLength": 32}},
                                             "required": ["expression"], "additionalProperties": False}}}
WEATHER = {"type": "function", "function": {"name": "weather", "description": "Today's weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 24}},
                                                "required": ["city"], "additionalProperties": False}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "likes_tea": {"enum": ["yes", "no"]}},
          "required": ["name", "age", "likes_tea"], "additionalProperties": False}
MAX_TOKENS = 96
"""Per reply in the validity runs: a reply cut here is incomplete whatever the grammar (counted apart)."""
CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Tokyo", "Quito", "Perth", "Dakar"]
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana"]


def tool_prompt(rng: random.Random) -> list[dict]:
    if rng.random() < 0.5:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        q = rng.choice([f"What is {a}+{b}?", f"Use the calculator: {a}*{b}", f"Compute {a} - {b} please."])
    else:
        q = rng.choice(["What's the weather in {c}?", "Is it raining in {c} today?", "Weather for {c}, please."]
                       ).format(c=rng.choice(CITIES))
    return [{"role": "user", "content": q}]


def json_prompt(rng: random.Random) -> list[dict]:
    n = rng.choice(NAMES)
    return [{"role": "system", "content": "Answer with a JSON object: name, age, likes_tea (yes or no)."},
            {"role": "user", "content": f"{n} is {rng.randint(5, 90)} and {rng.choice(['loves', 'hates'])} tea."}]


def valid_args(schema: dict, args: dict) -> bool:
    props = schema["properties"]
    if set(args) != set(schema["required"]) or not set(args) <= set(props):
        return False
    for k, v in args.items():
        p = props[k]
        if "enum" in p and v not in p["enum"]:
            return False
        if p.get("type") == "string" and not (isinstance(v, str) and len(v) <= p.get("maxLength", 10**9)):
            return False
        if p.get("type") == "integer" and not (isinstance(v, int) and not isinstance(v, bool)
                                               and p.get("minimum", -10**18) <= v <= p.get("maximum", 10**18)):
            return False
    return True


def build(body: dict, renderer, constrained: bool) -> tuple[list[int], dict | None]:
    req = parse_chat_request(body, 2048)
    use_tools = bool(req.tools)
    tag = build_constraint(req, use_tools, constrain_tools=constrained)
    if not constrained:
        tag = None
    ids = renderer.render(req.messages, req.tools if use_tools else None)
    return ids, tag


async def generate(engine, ids, tag, max_tokens, seed, temperature=0.7, finish: list | None = None) -> list[int]:
    p = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, constraint=tag)
    out = []
    async for ev in engine.generate(GenerationRequest(ids, p)):
        if ev.token_id is not None:
            out.append(ev.token_id)
        if ev.finish_reason is not None and finish is not None:
            finish.append(ev.finish_reason)
    return out


async def validity(engine, renderer, n: int) -> dict:
    rng = random.Random(0)
    tool_bodies = [{"messages": tool_prompt(rng), "tools": [CALC, WEATHER], "parallel_tool_calls": False}
                   for _ in range(n)]
    json_bodies = [{"messages": json_prompt(rng), "response_format": {
        "type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}} for _ in range(n)]
    schemas = {"calculator": CALC["function"]["parameters"], "weather": WEATHER["function"]["parameters"]}
    out: dict = {}
    sem = asyncio.Semaphore(8)
    for constrained in (False, True):
        cut: list = []

        async def one_tool(i, body):
            async with sem:
                ids, tag = build(body, renderer, constrained)
                fin: list = []
                text = engine.tokenizer.decode(await generate(engine, ids, tag, MAX_TOKENS, i, finish=fin),
                                               skip_special_tokens=True)
            cut.append(("tool", "<tool_call>" in text, fin == ["length"]))
            _, calls, _ = ToolStream(HermesToolParser()).finish(text)
            attempted = "<tool_call>" in text
            ok = False
            for c in calls[:1]:
                try:
                    args = json.loads(c["function"]["arguments"])
                except json.JSONDecodeError:
                    continue
                ok = c["function"]["name"] in schemas and isinstance(args, dict) and valid_args(
                    schemas[c["function"]["name"]], args)
            return attempted, ok

        async def one_json(i, body):
            async with sem:
                ids, tag = build(body, renderer, constrained)
                fin: list = []
                text = engine.tokenizer.decode(await generate(engine, ids, tag, MAX_TOKENS, i, finish=fin),
                                               skip_special_tokens=True)
            cut.append(("json", True, fin == ["length"]))
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                return False
            return isinstance(obj, dict) and valid_args(PERSON, obj)

        tools = await asyncio.gather(*(one_tool(i, b) for i, b in enumerate(tool_bodies)))
        jsons = await asyncio.gather(*(one_json(i, b) for i, b in enumerate(json_bodies)))
        key = "constrained" if constrained else "free"
        out[key] = {"tool_call_attempted": sum(a for a, _ in tools) / n,
                    "tool_call_valid": sum(v for _, v in tools) / n,
                    "valid_among_attempted": (sum(v for _, v in tools) / max(1, sum(a for a, _ in tools))),
                    "json_valid": sum(jsons) / n,
                    "tool_calls_cut_by_max_tokens": sum(1 for k, a, c in cut if k == "tool" and a and c),
                    "json_cut_by_max_tokens": sum(1 for k, _, c in cut if k == "json" and c)}
    return out


async def cost(engine, renderer, rounds: int, max_tokens: int) -> dict:
    rng = random.Random(1)
    bodies = [{"messages": json_prompt(rng), "response_format": {
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}} for _ in range(8)]
    g = engine.grammars()
    res: dict = {}
    for conc in (1, 8):
        per = {"free": [], "constrained": []}
        mask = []
        for r in range(rounds):
            order = ("free", "constrained") if r % 2 == 0 else ("constrained", "free")
            for key in order:
                built = [build(b, renderer, key == "constrained") for b in bodies[:conc]]
                m0, t0s = g.masked_tokens, g.mask_s
                t0 = time.perf_counter()
                # temperature 0 and a fixed length: the same amount of work with and without
                outs = await asyncio.gather(*(generate(engine, ids, tag, max_tokens, 7, temperature=0.0)
                                              for ids, tag in built))
                dt = time.perf_counter() - t0
                ntok = sum(len(o) for o in outs)
                per[key].append(1000 * dt / ntok * conc)  # ms per token per sequence
                if key == "constrained" and g.masked_tokens > m0:
                    mask.append(1e6 * (g.mask_s - t0s) / (g.masked_tokens - m0))
        free, con = statistics.median(per["free"]), statistics.median(per["constrained"])
        res[f"c{conc}"] = {"free_ms_per_token": round(free, 3), "constrained_ms_per_token": round(con, 3),
                           "ratio": round(statistics.median(c / f for c, f in zip(per["constrained"], per["free"])), 3),
                           "mask_fill_us_per_token": round(statistics.median(mask), 1) if mask else None}
    return res


async def main_async(args) -> dict:
    model = args.model
    if not model:
        from clawloop.tinymodel.build import build_random_model, default_model_dir

        model = str(default_model_dir())
        if not Path(model).exists():
            model = str(build_random_model(Path(tempfile.mkdtemp()) / "random", seed=0))
            args.model_kind = "random (tiny model not built)"
    engine = HFEngine(model, device="cpu", dtype="float32", max_batch_size=16, max_model_len=2048,
                      threads=args.threads)
    await engine.start()
    try:
        renderer = renderer_for(engine.tokenizer)
        c = await cost(engine, renderer, args.rounds, args.max_tokens)
        v = await validity(engine, renderer, args.prompts)
    finally:
        await engine.stop()
    return {"bench": "constrained_decoding", "model": args.model_kind or model, "vocab": engine.vocab_size,
            "cost": c, "validity": v, "prompts": args.prompts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    args.model_kind = ""
    res = asyncio.run(main_async(args))
    print(f"model: {res['model']} (vocab {res['vocab']})")
    for k, v in res["cost"].items():
        print(f"{k}: free {v['free_ms_per_token']} ms/token, constrained {v['constrained_ms_per_token']} ms/token, "
              f"ratio {v['ratio']}, mask fill {v['mask_fill_us_per_token']} us/token")
    for k, v in res["validity"].items():
        print(f"{k:12s} tool call attempted {v['tool_call_attempted']:.1%}  valid {v['tool_call_valid']:.1%}  "
              f"(valid among attempted {v['valid_among_attempted']:.1%})  json valid {v['json_valid']:.1%}  "
              f"cut by max_tokens: calls {v['tool_calls_cut_by_max_tokens']}, json {v['json_cut_by_max_tokens']}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()

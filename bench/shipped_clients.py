"""How often real clients' structured calls finish on a served model (issue #28 item 5): the calls of
tests/test_shipped_clients.py, greedy plus seeds 0-9, against `clawloop serve` of the shipped tiny model
(or the model folder given as the first argument); further arguments go to `clawloop serve`. Beside
how many calls finish with an object, how many `Sum` answers are right (12+7 = 19): a valid object
is not a correct one.

    .venv/bin/python bench/shipped_clients.py [MODEL_DIR] [SERVE FLAGS...]
    .venv/bin/python bench/shipped_clients.py --close-json-tokens 0    # the model alone closes its JSON
"""
import os, subprocess, sys, tempfile, time
import httpx
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_shipped_clients as t
from conftest import free_port
port = free_port(); data = tempfile.mkdtemp(prefix="shipped-clients-")
p = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "serve", "--data-dir", data, "--port", str(port)] + (["--model-path", sys.argv[1]] if sys.argv[1:2] and not sys.argv[1].startswith("--") else []) + [a for i, a in enumerate(sys.argv[1:]) if i or a.startswith("--")], stdout=open(os.path.join(data, "serve.log"), "w"), stderr=subprocess.STDOUT)
url = f"http://127.0.0.1:{port}"
try:
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200: break
        except httpx.HTTPError: pass
        time.sleep(0.2)
    def tool(seed):
        msg = t._chat_model(url, seed).bind_tools([t.CALC], tool_choice="calculator").invoke("What is 12+7?")
        (tc,) = msg.tool_calls; assert isinstance(tc["args"]["expression"], str); return tc["args"]
    right = {}
    def so(method, model):
        def call(seed):  # LangChain returns None for an object it could not parse
            out = t._chat_model(url, seed).with_structured_output(model, method=method).invoke("What is 12+7?")
            assert isinstance(out, model), out
            if model is t.Sum: right[method] = right.get(method, 0) + (out.answer == 19)
        return call
    t.SEEDS = range(10)
    for name, fn in [("named tool_choice", tool), ("json_schema Sum", so("json_schema", t.Sum)), ("function_calling Sum", so("function_calling", t.Sum)),
                     ("json_schema Verdict", so("json_schema", t.Verdict)), ("function_calling Verdict", so("function_calling", t.Verdict))]:
        ok, errs = t._tally(fn)
        print(f"{name}: {ok}/11 (greedy + seeds 0-9)", errs[:2], flush=True)
    print("Sum answers right (19):", right, flush=True)
finally:
    p.terminate(); p.wait(30)

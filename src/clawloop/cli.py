"""The `clawloop` command.

    clawloop up            serve + capture + judge + train, in one process
    clawloop serve         serve + capture only
    clawloop judge         the judge loop alone, on a store (another machine)
    clawloop train         the trainer alone, on a store or a rollout buffer
    clawloop buffer        the rollout buffer service (`buffer new-generator NAME`)
    clawloop export        sessions as JSONL
    clawloop import        JSONL sessions into the store
    clawloop tiny-model    build the embedded tiny chat model
    clawloop judge-eval    score a judge on a labelled JSONL set
    clawloop demo          the learning benchmark with simulated users
    clawloop eval          simulated users (personas) or a checkpoint's tasks, scored before/after
    clawloop env check     run every agent task's reference solution and a do-nothing agent
    clawloop env coldstart train on a track's verified reference solutions before RL (a new model folder)
    clawloop envpool       serve an agent track's environment pool (lease API) over HTTP
    clawloop swe make-tasks  inject bugs into the SWE track's repos, write SWE-bench instances
    clawloop status        a running clawloop's policy version, engines and actors (`--ray`: nodes too)

Each command takes the config flags of what it runs (`clawloop CMD --help` lists them); a flag of
another command's part is an error naming it, never accepted and ignored. A YAML `--config` file and
CLAWLOOP_* environment variables may hold every key: several commands share them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable

from clawloop.config import ConfigError, add_config_arguments, leaf_in, leaf_of_flag, load_config

TRACK_NAMES = ("toolcall", "terminal", "swe", "gui")
COMMANDS = ("up", "serve", "judge", "train", "buffer", "export", "import", "tiny-model", "judge-eval", "demo", "eval", "env",
            "envpool", "swe", "status")


# The config each command reads: sections, or dotted keys of a section it reads one value of.
SCOPES: dict[str, tuple[str, ...]] = {
    "up": ("model", "serve", "capture", "judge", "train", "gate", "ray"),
    "serve": ("model", "serve", "capture", "ray"),
    "judge": ("judge", "model", "ray"),
    "train": ("train", "gate", "judge", "model", "ray"),  # judge: whose verdicts it trains on
    "buffer": ("buffer", "env", "ray", "serve.insecure", "train.n_samples_per_prompt",
               "serve.host", "serve.port"),  # where the gateway is: the default remote_engine_url
    "export": (),
    "import": ("model",),  # the tokenizer of turns imported without token ids
    "env check": ("env",),
    "env coldstart": ("env", "model.path"),
    "envpool": ("env", "serve.insecure"),
    "judge-eval": ("judge", "model"),
}


def takers(leaf) -> list[str]:
    """The commands whose flags include this config leaf."""
    return [cmd for cmd, scope in SCOPES.items() if leaf_in(leaf, scope)]


def _parser(cmd: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"clawloop {cmd}", description=description, allow_abbrev=False)
    p.set_defaults(__command__=cmd)
    add_config_arguments(p, SCOPES[cmd])
    return p


def parse_own(p: argparse.ArgumentParser, argv: list[str], cmd: str) -> argparse.Namespace:
    """`p.parse_args(argv)`, where a config flag that belongs to another command is a ConfigError naming
    it and the commands that take it (argparse's own error for anything else unknown)."""
    ns, unknown = p.parse_known_args(argv)
    for arg in unknown:
        leaf = leaf_of_flag(arg) if arg.startswith("--") else None
        if leaf is not None:
            raise ConfigError(f"{arg.split('=', 1)[0]}: {leaf.key} is not an option of `clawloop {cmd}`, which does "
                              f"not use it (taken by: {', '.join('clawloop ' + c for c in takers(leaf)) or 'none'})")
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    return ns


def _config(p: argparse.ArgumentParser, argv: list[str], extra: tuple[str, ...] = ()):
    ns = parse_own(p, argv, p.get_default("__command__"))
    vars(ns).pop("__command__", None)
    values = vars(ns)
    own = {k: values.pop(k) for k in list(values) if k in extra}
    cfg = load_config(values)
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return cfg, own


def cmd_serve(argv: list[str], *, full: bool) -> int:
    from clawloop.apps.serve import run

    p = _parser("up" if full else "serve",
                "Serve the model with capture" + (", judge and trainer in the background." if full else "."))
    if full:
        p.add_argument("--buffer", dest="buffer_url_up", default=None,
                       help="Also train on groups from this rollout buffer URL.")
    else:
        p.add_argument("--workers", type=int, default=1,
                       help="Gateway processes sharing the port (SO_REUSEPORT), each with its own engine; more than "
                            "1 needs a shared --store postgresql://... (docs/SCALING.md).")
    cfg, own = _config(p, argv, ("buffer_url_up", "workers"))
    if own.get("buffer_url_up"):
        cfg.train.source, cfg.train.buffer_url = "buffer", own["buffer_url_up"]
    workers = own.get("workers") or 1
    if workers < 1 or (workers > 1 and not cfg.store.startswith(("postgresql://", "postgres://"))):
        raise ConfigError(f"--workers {workers}: must be 1, or more with a shared --store postgresql://... "
                          "(several gateway processes must link sessions through one store: docs/SCALING.md)")
    return run(cfg, judge=full and cfg.judge.kind != "none", train=full and cfg.train.enabled, workers=workers)


def cmd_judge(argv: list[str]) -> int:
    import asyncio

    from clawloop.apps.judge import run_judge

    cfg, _ = _config(_parser("judge", "Run the judge loop on a store."), argv)
    try:
        asyncio.run(run_judge(cfg))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_train(argv: list[str]) -> int:
    from clawloop.apps.train import run_train

    p = _parser("train", "Run the trainer on a store (or a rollout buffer with --source buffer).")
    p.add_argument("--steps", type=int, default=0,
                   help="Stop after this many steps of this run (0: run until interrupted).")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="Stop (with a checkpoint) once the source has too little left for a batch.")
    cfg, own = _config(p, argv, ("steps", "exit_when_idle"))
    return run_train(cfg, max_steps=own["steps"], exit_when_idle=own["exit_when_idle"])


def cmd_buffer(argv: list[str]) -> int:
    if argv and argv[0] == "new-generator":
        from clawloop.buffer import write_generator_template

        p = argparse.ArgumentParser(prog="clawloop buffer new-generator")
        p.add_argument("name")
        p.add_argument("--dir", default=".", help="Folder to write NAME_generator.py into.")
        a = p.parse_args(argv[1:])
        path = write_generator_template(a.name, a.dir)
        print(path)
        return 0
    from clawloop.apps.buffer import run_buffer

    # In this command --host/--port mean the buffer's own address.
    renamed = []
    for a in argv:
        for flag, to in (("--host", "--buffer-host"), ("--port", "--buffer-port")):
            if a == flag or a.startswith(flag + "="):
                a = to + a[len(flag):]
        renamed.append(a)
    cfg, _ = _config(_parser("buffer", "Run the rollout buffer service."), renamed)
    run_buffer(cfg)
    return 0


def cmd_export(argv: list[str]) -> int:
    from clawloop.trajectories import export_sessions

    p = _parser("export", "Write captured sessions as JSONL, one session per line.")
    p.add_argument("--out", required=True, help="Output file (- for stdout).")
    p.add_argument("--tenant", default=None, help="Only this tenant's sessions (the NAME of --api-key NAME=KEY).")
    cfg, own = _config(p, argv, ("out", "tenant"))
    n = export_sessions(cfg.data_dir, own["out"], tenant=own["tenant"], store_url=cfg.store)
    print(f"exported {n} session(s) to {own['out']}", file=sys.stderr)
    return 0


def cmd_import(argv: list[str]) -> int:
    import os

    from clawloop.trajectories import import_sessions

    p = _parser("import", "Read JSONL sessions (the export shape; token fields optional) into the store.")
    p.add_argument("--file", dest="file", default=os.environ.get("DATA_PATH"),
                   help="JSONL file to import (env DATA_PATH).")
    cfg, own = _config(p, argv, ("file",))
    if not own["file"]:
        raise ConfigError("--file: give the JSONL file to import (or env DATA_PATH)")
    n_sessions, n_turns = import_sessions(cfg, own["file"])
    from clawloop.naming import store_name

    print(f"imported {n_turns} turn(s) in {n_sessions} session(s) into {store_name(cfg)}", file=sys.stderr)
    return 0


def cmd_tiny_model(argv: list[str]) -> int:
    from clawloop.tinymodel.build import main

    return main(argv) or 0


def cmd_judge_eval(argv: list[str]) -> int:
    from clawloop.judge import judge_eval_main

    return judge_eval_main(argv) or 0


def cmd_eval(argv: list[str]) -> int:
    from clawloop.eval import main

    return main(argv) or 0


def cmd_demo(argv: list[str]) -> int:
    from clawloop.demo import main

    return main(argv) or 0


def _env_options(cfg) -> "Any":
    from clawloop.envs.base import EnvOptions

    e = cfg.env
    return EnvOptions(max_steps=e.max_steps, sandbox=e.sandbox, allow_unsandboxed=e.allow_unsandboxed,
                      command_timeout_s=e.command_timeout_s, memory_mb=e.memory_mb, disk_mb=e.disk_mb,
                      task_dir=e.task_dir, tools_config=e.tools_config, screenshot_backend=e.screenshot_backend,
                      gui_observation=e.gui_observation)


def _track_of(cfg, own_track: str | None) -> str:
    track = own_track or cfg.env.track
    if not track:
        raise ConfigError("env.track: name the track with --track (or ENV_TYPE): toolcall, terminal, swe or gui")
    return track


def cmd_env(argv: list[str]) -> int:
    if argv and argv[0] == "coldstart":
        return cmd_env_coldstart(argv[1:])
    if not argv or argv[0] != "check":
        print("usage: clawloop env check --track toolcall|terminal|swe|gui [--task-dir DIR] [--tasks a,b]\n"
              "       clawloop env coldstart --track T --out DIR [--steps N] [--lr LR] [--model-path P]",
              file=sys.stderr)
        return 2
    from clawloop.envs.check import run_check
    from clawloop.envs.sandbox import SandboxUnavailable

    p = _parser("env check", "Run every task's reference solution (must score the maximum) and a do-nothing "
                             "agent (must not), sandboxed, in parallel.")
    p.add_argument("--track", default=None, choices=TRACK_NAMES, help="Track (or ENV_TYPE).")
    p.add_argument("--tasks", default="", help="Only these task ids, comma-separated.")
    cfg, own = _config(p, argv[1:], ("track", "tasks"))
    track = _track_of(cfg, own["track"])
    if track == "gui":
        from clawloop.envs.gui import missing_requirements

        why = missing_requirements(cfg.env.screenshot_backend)
        if why:
            raise ConfigError(f"env.screenshot_backend: the gui track cannot run here: {why}")
    try:
        results = run_check(track, _env_options(cfg), task_ids=[t for t in own["tasks"].split(",") if t] or None,
                            parallel=cfg.env.parallel_envs)
    except (ValueError, SandboxUnavailable) as e:
        raise ConfigError(str(e)) from None
    return 0 if results and all(r.oracle_pass and r.noop_fail for r in results) else 1


def cmd_env_coldstart(argv: list[str]) -> int:
    from clawloop.envs.coldstart import cold_start
    from clawloop.envs.sandbox import SandboxUnavailable

    p = _parser("env coldstart", "Supervised cold start before RL: play each training task's reference solution "
                                 "through its environment, keep those that score the maximum, train the model on "
                                 "their assistant turns, save it to --out (envs/coldstart.py).")
    p.add_argument("--track", default=None, choices=TRACK_NAMES, help="Track (or ENV_TYPE).")
    p.add_argument("--tasks", default="", help="Only these task ids or patterns (`math-*`), comma-separated "
                                               "(default: every task of the track or --task-dir: leave out the ones "
                                               "you evaluate on).")
    p.add_argument("--out", required=True, help="New folder for the trained model (must not exist or be empty).")
    p.add_argument("--steps", type=int, default=1920, help="Optimizer steps (default 1920).")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (default 3e-4).")
    p.add_argument("--batch-size", type=int, default=8, help="Rows per step (default 8).")
    p.add_argument("--replay", type=float, default=0.75,
                   help="Share of each batch's rows that replay the starting model's own answers to plain "
                        "questions, trained towards its whole distribution: what it could do is kept (default "
                        "0.75; 0: none).")
    p.add_argument("--replay-prompts", default="",
                   help="The plain questions to replay: a file, one per line or JSONL with 'prompt'. Default: the "
                        "tasks' questions without tools and, for the tiny model, 512 of its corpus's.")
    p.add_argument("--seed", type=int, default=0)
    cfg, own = _config(p, argv, ("track", "tasks", "out", "steps", "lr", "batch_size", "replay", "replay_prompts",
                                 "seed"))
    track = _track_of(cfg, own["track"])
    prompts = None
    if own["replay_prompts"]:
        from clawloop.envs.coldstart import read_prompts

        try:
            prompts = read_prompts(own["replay_prompts"])
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if track == "gui":
        raise ConfigError("--track gui: its reference solutions read the live page (no fixed messages to train on)")
    from clawloop.naming import model_path

    try:
        res = cold_start(model_path(cfg), own["out"], track, _env_options(cfg), steps=own["steps"], lr=own["lr"],
                         batch_size=own["batch_size"], replay=own["replay"],
                         task_ids=[t for t in own["tasks"].split(",") if t] or None, seed=own["seed"],
                         parallel=cfg.env.parallel_envs, replay_prompts=prompts)
    except (ValueError, SandboxUnavailable) as e:
        raise ConfigError(str(e)) from None
    import json

    print(json.dumps({"out": res.out, "demos": res.demos, "skipped": len(res.skipped), "steps": len(res.losses),
                      "first_loss": res.losses[0], "final_loss": res.losses[-1], "seconds": res.seconds}))
    return 0


def cmd_envpool(argv: list[str]) -> int:
    from clawloop.envs.pool import run_pool_server

    p = _parser("envpool", "Serve one agent track's environment pool (allocate/reset/step/evaluate/close leases).")
    p.add_argument("--track", default=None, choices=TRACK_NAMES, help="Track (or ENV_TYPE).")
    # In this command --host/--port mean the pool's own address (default port 8890).
    renamed, host, port = [], "127.0.0.1", 8890
    it = iter(argv)
    for a in it:
        if a in ("--host", "--port"):
            v = next(it, None)
            if v is None:
                raise ConfigError(f"{a} needs a value")
            host, port = (v, port) if a == "--host" else (host, int(v))
        elif a.startswith("--host="):
            host = a.split("=", 1)[1]
        elif a.startswith("--port="):
            port = int(a.split("=", 1)[1])
        else:
            renamed.append(a)
    cfg, own = _config(p, renamed, ("track",))
    if host not in ("127.0.0.1", "localhost", "::1") and not cfg.serve.insecure:
        raise ConfigError(f"envpool --host {host}: the pool runs agent commands for whoever reaches it; bind "
                          "127.0.0.1 (reach it over an SSH tunnel) or pass --insecure if you really mean it")
    run_pool_server(_track_of(cfg, own["track"]), _env_options(cfg), host=host, port=port,
                    capacity=cfg.env.parallel_envs, lease_ttl_s=cfg.env.lease_ttl_s)
    return 0


def cmd_swe(argv: list[str]) -> int:
    if not argv or argv[0] != "make-tasks":
        print("usage: clawloop swe make-tasks [--repos DIR] [--out FILE] [--max-per-repo N] [--seed S]",
              file=sys.stderr)
        return 2
    from clawloop.envs.swe.tasks import main as make_tasks

    return make_tasks(argv[1:]) or 0


def gate_line(g: dict[str, Any]) -> str:
    """The publish gate's state in one line, from /health's `gate` (the trainer's gate/* stats)."""
    if not g.get("size"):
        return "publish gate: nothing to check (pass --regression-set FILE): versions are published unchecked"
    groups = sorted(k[len("baseline/"):] for k in g if k.startswith("baseline/"))
    if "last_checked_version" not in g:
        return (f"publish gate: {g['size']:.0f} checks, baseline " + ", ".join(f"{x} {g[f'baseline/{x}']:.3f}"
                                                                              for x in groups)
                + f" (tolerance {g.get('tolerance', 0):.3f}); no candidate checked yet")
    verdict = "passed" if g.get("last_passed") else "REFUSED"
    scores = ", ".join(f"{x} {g.get(f'score/{x}', float('nan')):.3f}/{g[f'baseline/{x}']:.3f}" for x in groups)
    return (f"publish gate: v{g['last_checked_version']:.0f} {verdict} (score/baseline {scores}, tolerance "
            f"{g.get('tolerance', 0):.3f}); {g.get('refused', 0):.0f} of {g.get('candidates', 0):.0f} candidates "
            f"refused" + (f"; serving fell back to an earlier version's weights {g['fallbacks']:.0f} time(s)"
                          if g.get("fallbacks") else "")
            + (f"; {g['recovered']:.0f} of {g.get('recoveries', 0):.0f} recovery step(s) (rehearsal alone) published"
               if g.get("recoveries") else "")
            + (f"; {g['near_served']:.0f} read on to a confirming round within 0.01 of the served version"
               if g.get("near_served") else "") + f"; last check {g.get('last_check_s', 0):.2f} s")


def cmd_status(argv: list[str]) -> int:
    import json

    import httpx

    p = argparse.ArgumentParser(prog="clawloop status", allow_abbrev=False,
                                description="Ask a running clawloop (its /health) what it serves and which actors "
                                            "it runs, with their state, node and restarts.")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="The clawloop to ask (default %(default)s).")
    p.add_argument("--ray", action="store_true", help="Also list the Ray cluster's nodes and their resources.")
    p.add_argument("--json", action="store_true", help="Print /health's JSON as it is.")
    p.add_argument("--store", default=None,
                   help="Read a store instead of asking a gateway: a postgresql:// URL or a SQLite file (its turns, "
                        "sessions, verdicts per judge and what each judge has left).")
    a = p.parse_args(argv)
    if a.store is not None:
        return store_status(a.store, as_json=a.json)
    try:
        r = httpx.get(a.url.rstrip("/") + "/health", timeout=15)
        h = r.json()
    except (httpx.HTTPError, ValueError) as e:
        print(f"clawloop status: no clawloop answering at {a.url}: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(h, indent=2))
        return 0 if h.get("status") == "ok" else 1
    print(f"{a.url}: {h.get('status')}  policy v{h.get('policy_version')}  backend {h.get('backend', 'hf')}  "
          f"inflight {h.get('inflight', 0)}")
    if h.get("gate"):
        print("  " + gate_line(h["gate"]))
    actors = h.get("actors") or h.get("replicas") or []
    if actors:
        cols = ("name", "role", "state", "node_ip", "pid", "resources", "policy_version", "restarts", "ray_name",
                "last_error")

        def cell(x: dict[str, Any], c: str) -> str:
            v = x.get(c)
            if isinstance(v, dict):
                return ",".join(f"{k}:{n:g}" for k, n in v.items()) or "-"
            return "-" if v is None else str(v)

        rows = [[cell(x, c) for c in cols] for x in actors]
        widths = [max(len(c), *(len(row[i][:60]) for row in rows)) for i, c in enumerate(cols)]
        for row in [list(cols)] + rows:
            print("  " + "  ".join(v[:60].ljust(w) for v, w in zip(row, widths)).rstrip())
    cluster = h.get("ray")
    if a.ray:
        if not cluster:
            print("  (not running on Ray: start it with --ray auto|local)")
        elif "error" in cluster:
            print(f"  ray: {cluster['error']}")
        else:
            print(f"ray {cluster.get('mode')} cluster at {cluster.get('address')}")
            for n in cluster.get("nodes", []):
                res = ", ".join(f"{k} {v:g}" for k, v in sorted(n.get("resources", {}).items())
                                if not k.startswith("node:") and not k.endswith("memory") and "bundle_group" not in k)
                print(f"  node {n.get('node_ip')} {n.get('node_id', '')[:12]} {'alive' if n.get('alive') else 'dead'}: "
                      f"{res}")
            avail = cluster.get("available", {})
            print("  available: " + ", ".join(f"{k} {avail.get(k, 0):g}" for k in ("CPU", "GPU") if k in
                                              cluster.get("resources", {})))
    return 0 if h.get("status") == "ok" else 1


def store_status(spec: str, as_json: bool = False) -> int:
    """`clawloop status --store S`: a store's totals, from the store itself (no gateway needed)."""
    import json
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    from clawloop.naming import open_store, store_exists, store_name

    if "://" in spec and not spec.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"--store: {spec.split('://', 1)[0]}:// is not a store: give a postgresql:// URL or a "
                          "SQLite file")
    with tempfile.TemporaryDirectory(prefix="clawloop-status-") as tmp:  # a spill file, never used by reads
        named = SimpleNamespace(data_dir=tmp if "://" in spec else str(Path(spec).parent), store=spec)
        if not store_exists(named):
            raise ConfigError(f"--store: no store at {spec}")
        store = open_store(named)
        try:
            st = store.stats()
            judges = {j: store.count_pending_judgement(j) for j in sorted(store.judge_names())}
        finally:
            store.close()
    totals = {k: v for k, v in st.items() if "/" not in k}
    if as_json:
        print(json.dumps({"store": store_name(named), **totals, "judges_pending": judges}, indent=2))
        return 0
    print(f"{store_name(named)}: {totals['sessions']} session(s) ({totals['open_sessions']} open), "
          f"{totals['turns']} turn(s) ({totals['main_turns']} main, {totals['side_turns']} side), "
          f"{totals['judgements']} verdict(s)")
    for j, pending in judges.items():
        print(f"  judge {j}: {pending} turn(s) waiting")
    return 0


HANDLERS: dict[str, Callable[[list[str]], int]] = {
    "up": lambda a: cmd_serve(a, full=True),
    "serve": lambda a: cmd_serve(a, full=False),
    "judge": cmd_judge,
    "train": cmd_train,
    "buffer": cmd_buffer,
    "export": cmd_export,
    "import": cmd_import,
    "tiny-model": cmd_tiny_model,
    "judge-eval": cmd_judge_eval,
    "demo": cmd_demo,
    "eval": cmd_eval,
    "env": cmd_env,
    "envpool": cmd_envpool,
    "swe": cmd_swe,
    "status": cmd_status,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    cmd, rest = argv[0], argv[1:]
    handler = HANDLERS.get(cmd)
    if handler is None:
        print(f"clawloop: unknown command {cmd!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return handler(rest)
    except ConfigError as e:
        print(f"clawloop {cmd}: config error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

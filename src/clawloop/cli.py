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

Every command that reads config takes the same flags (see `clawloop up --help`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

from clawloop.config import ConfigError, add_config_arguments, load_config

COMMANDS = ("up", "serve", "judge", "train", "buffer", "export", "import", "tiny-model", "judge-eval", "demo")


def _parser(cmd: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"clawloop {cmd}", description=description, allow_abbrev=False)
    add_config_arguments(p)
    return p


def _config(p: argparse.ArgumentParser, argv: list[str], extra: tuple[str, ...] = ()):
    ns = p.parse_args(argv)
    values = vars(ns)
    own = {k: values.pop(k) for k in list(values) if k in extra}
    cfg = load_config(values)
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return cfg, own


def cmd_serve(argv: list[str], *, full: bool) -> int:
    from clawloop.runtime import run

    p = _parser("up" if full else "serve",
                "Serve the model with capture" + (", judge and trainer in the background." if full else "."))
    if full:
        p.add_argument("--buffer", dest="buffer_url_up", default=None,
                       help="Also train on groups from this rollout buffer URL.")
    cfg, own = _config(p, argv, ("buffer_url_up",))
    if own.get("buffer_url_up"):
        cfg.train.source, cfg.train.buffer_url = "buffer", own["buffer_url_up"]
    return run(cfg, judge=full and cfg.judge.kind != "none", train=full and cfg.train.enabled)


def cmd_judge(argv: list[str]) -> int:
    import asyncio

    from clawloop.judge import run_judge_service

    cfg, _ = _config(_parser("judge", "Run the judge loop on a store."), argv)
    try:
        asyncio.run(run_judge_service(cfg))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_train(argv: list[str]) -> int:
    from clawloop.trainer.service import run_trainer_service

    p = _parser("train", "Run the trainer on a store (or a rollout buffer with --source buffer).")
    p.add_argument("--steps", type=int, default=0,
                   help="Stop after this many steps of this run (0: run until interrupted).")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="Stop (with a checkpoint) once the source has too little left for a batch.")
    cfg, own = _config(p, argv, ("steps", "exit_when_idle"))
    return run_trainer_service(cfg, max_steps=own["steps"], exit_when_idle=own["exit_when_idle"])


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
    from clawloop.buffer import run_buffer

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
    n = export_sessions(cfg.data_dir, own["out"], tenant=own["tenant"])
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
    print(f"imported {n_turns} turn(s) in {n_sessions} session(s) into {cfg.data_dir}", file=sys.stderr)
    return 0


def cmd_tiny_model(argv: list[str]) -> int:
    from clawloop.tinymodel.build import main

    return main(argv) or 0


def cmd_judge_eval(argv: list[str]) -> int:
    from clawloop.judge import judge_eval_main

    return judge_eval_main(argv) or 0


def cmd_demo(argv: list[str]) -> int:
    from clawloop.demo import main

    return main(argv) or 0


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

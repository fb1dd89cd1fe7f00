"""One config tree: defaults < YAML < env < flags, the aliases users type, and
errors that name the key."""

from __future__ import annotations

import argparse

import pytest
import yaml

from clawloop.config import ConfigError, add_config_arguments, load_config
from clawloop.config_out import write_resolved


def flags(*argv):
    p = argparse.ArgumentParser(allow_abbrev=False)
    add_config_arguments(p)
    return vars(p.parse_args(list(argv)))


def test_defaults():
    cfg = load_config({}, env={})
    assert cfg.serve.host == "127.0.0.1" and cfg.serve.port == 8000
    assert cfg.model.backend == "hf" and cfg.capture.enabled and cfg.train.method == "combine"


def test_precedence_yaml_env_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"serve": {"port": 9001, "host": "127.0.0.2"}, "train": {"lr": 0.001}}))
    cfg = load_config({}, config_file=str(f), env={})
    assert cfg.serve.port == 9001 and cfg.train.lr == 0.001
    cfg = load_config({}, config_file=str(f), env={"OPENCLAW_PORT": "9002"})
    assert cfg.serve.port == 9002 and cfg.serve.host == "127.0.0.2"
    cfg = load_config(flags("--port", "9003"), config_file=str(f), env={"OPENCLAW_PORT": "9002"})
    assert cfg.serve.port == 9003


def test_aliases_users_type():
    env = {"MODEL_PATH": "/m", "OPENCLAW_HOST": "127.0.0.9", "CKPT_SAVE_DIR": "/ck", "MAJORITY_VOTE_N": "3",
           "MAJORITY_VOTE_THRESHOLD": "0.6", "JUDGE_MODEL_PATH": "judge-m"}
    cfg = load_config({}, env=env)
    assert cfg.model.path == "/m" and cfg.serve.host == "127.0.0.9" and cfg.train.save_dir == "/ck"
    assert cfg.judge.majority_vote_n == 3 and cfg.judge.majority_vote_threshold == 0.6
    assert cfg.judge.model == "judge-m"
    assert load_config({}, env={"BASE_MODEL_PATH": "/b"}).model.path == "/b"
    cfg = load_config(flags("--model-path", "/x", "--backend", "hf", "--rl-buffer-dir", "/d",
                            "--enable-rl-intercept", "--use-lora", "--lora-rank", "8", "--num-judge-workers", "4"),
                      env={})
    assert cfg.model.path == "/x" and cfg.data_dir == "/d" and cfg.capture.enabled
    assert cfg.train.use_lora and cfg.train.lora_rank == 8 and cfg.judge.num_workers == 4
    assert load_config(flags("--no-enable-rl-intercept"), env={}).capture.enabled is False


def test_flag_strings_in_env():
    cfg = load_config({}, env={"OPTIMIZER_ARGS": "--lr 3e-4 --adam-beta2 0.95", "LORA_ARGS": "--use-lora --lora-rank 4",
                               "ROLLOUT_ARGS": "--rollout-batch-size 16 --num-rollouts-per-prompt 4"})
    assert cfg.train.lr == 3e-4 and cfg.train.adam_beta2 == 0.95 and cfg.train.use_lora
    assert cfg.train.lora_rank == 4 and cfg.train.rollout_batch_size == 16 and cfg.train.n_samples_per_prompt == 4
    with pytest.raises(ConfigError, match="--bogus"):
        load_config({}, env={"OPTIMIZER_ARGS": "--bogus 1"})


def test_unknown_names_are_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"serve": {"prot": 1}}))
    with pytest.raises(ConfigError, match="serve.prot"):
        load_config({}, config_file=str(f), env={})
    f.write_text(yaml.safe_dump({"nosuch": {"x": 1}}))
    with pytest.raises(ConfigError, match="nosuch"):
        load_config({}, config_file=str(f), env={})
    with pytest.raises(SystemExit):
        flags("--no-such-flag")


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="serve.port"):
        load_config({}, env={"OPENCLAW_PORT": "http"})
    with pytest.raises(ConfigError, match="serve.port"):
        load_config(flags("--port", "70000"), env={})
    with pytest.raises(ConfigError, match="model.backend"):
        load_config(flags("--backend", "tgi"), env={})
    with pytest.raises(ConfigError, match="judge.majority_vote_threshold"):
        load_config({}, env={"MAJORITY_VOTE_THRESHOLD": "2"})


def test_device_placement_names():
    cfg = load_config(flags("--offload-optimizer-state", "--train-device", "cuda:1"),
                      env={"TRAIN_GPUS": "0,1", "ROLLOUT_GPUS": "2,3"})
    assert cfg.train.offload_optimizer_state and cfg.train.device == "cuda:1"
    assert cfg.train.train_gpus == ["0", "1"] and cfg.train.rollout_gpus == ["2", "3"]
    with pytest.raises(ConfigError, match="train.train_gpus"):
        load_config({}, env={"TRAIN_GPUS": "gpu0"})
    with pytest.raises(ConfigError, match="train.device"):
        load_config(flags("--train-device", "tpu"), env={})


def test_engine_names():
    cfg = load_config(flags("--backend", "vllm", "--engine-url", "http://127.0.0.1:9001", "--engine-url",
                            "http://127.0.0.1:9002"), env={})
    assert cfg.model.engine_urls == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    with pytest.raises(ConfigError, match="model.engine_urls"):
        load_config(flags("--engine-url", "http://127.0.0.1:9001"), env={})
    with pytest.raises(ConfigError, match="model.backend must be one of hf, vllm.*got 'sglang'"):
        load_config(flags("--backend", "sglang"), env={})  # no SGLang engine: docs/GPU.md says why


def test_load_in_4bit_needs_lora_and_hf():
    assert load_config(flags("--load-in-4bit", "--use-lora"), env={}).model.load_in_4bit
    with pytest.raises(ConfigError, match="model.load_in_4bit: .*--use-lora"):
        load_config(flags("--load-in-4bit"), env={})
    with pytest.raises(ConfigError, match="model.load_in_4bit: .*--backend hf"):
        load_config(flags("--load-in-4bit", "--use-lora", "--backend", "vllm"), env={})


def test_write_resolved_masks_keys(tmp_path):
    cfg = load_config(flags("--api-key", "secret1", "--api-key", "secret2", "--data-dir", str(tmp_path)), env={})
    assert cfg.serve.api_keys == ["secret1", "secret2"]
    out = write_resolved(cfg)
    text = out.read_text()
    assert "secret" not in text
    data = yaml.safe_load(text)
    assert data["serve"]["port"] == 8000 and data["serve"]["api_keys"] == ["***", "***"]


# -- each command takes only its own flags (issue #29 item 8) ---------------------------------------


def test_a_flag_of_another_command_is_an_error_naming_it(tmp_path, capsys):
    from clawloop import cli

    rc = cli.main(["export", "--out", str(tmp_path / "x.jsonl"), "--data-dir", str(tmp_path), "--lr", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--lr: train.lr is not an option of `clawloop export`" in err
    assert "clawloop train" in err and "clawloop up" in err
    assert not (tmp_path / "x.jsonl").exists()  # nothing ran
    rc = cli.main(["serve", "--no-publish-gate"])
    assert rc == 2 and "gate.enabled is not an option of `clawloop serve`" in capsys.readouterr().err
    rc = cli.main(["train", "--port=9000"])
    assert rc == 2 and "--port: serve.port is not an option of `clawloop train`" in capsys.readouterr().err


def test_each_command_parses_its_own_flags_and_argparse_answers_the_rest():
    from clawloop import cli

    p = cli._parser("train", "")
    ns = cli.parse_own(p, ["--lr", "1e-3", "--judge", "frozen", "--model-path", "m", "--no-publish-gate"], "train")
    assert ns.train__lr == "1e-3" and ns.judge__kind == "frozen" and ns.gate__enabled == "false"
    p = cli._parser("envpool", "")
    assert cli.parse_own(p, ["--insecure", "--max-steps", "3"], "envpool").serve__insecure == "true"
    with pytest.raises(SystemExit):  # not a config flag at all: argparse's usage error
        cli.parse_own(cli._parser("export", ""), ["--definitely-not-a-flag"], "export")


def test_every_config_key_is_a_flag_of_some_command():
    """A key no command takes could only be set by YAML or env and read by nobody's flags: a config key
    that is accepted and ignored."""
    from clawloop import cli
    from clawloop.config import LEAVES

    orphans = [leaf.key for leaf in LEAVES if not cli.takers(leaf)]
    assert orphans == []


def test_auto_lr_by_the_trained_parameters():
    """--lr 0: the tiny model's rate (5e-4: at 2e-4 a persona's form moved too slowly in 16 updates,
    bench/RESULTS.md "Why the loop made the model worse" 6), a real model's usual one, LoRA's."""
    from clawloop.trainer.device import auto_lr

    assert auto_lr(1_136_512, lora=False) == 5e-4
    assert auto_lr(500_000_000, lora=False) == 1e-5
    assert auto_lr(1_136_512, lora=True) == auto_lr(500_000_000, lora=True) == 1e-4

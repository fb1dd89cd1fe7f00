"""Tiny random models of the families clawloop's parsers read, for tests: Qwen3 (thinking), Qwen3-MoE
(hybrid thinking), Llama 3 and Mistral, built locally in a second or two each (no download).

    from clawloop.tinymodel.families import build_family_model
    build_family_model("qwen3", out_dir)     # config, random weights, tokenizer, chat template

Each is the family's own architecture (`Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`, `LlamaForCausalLM`,
`MistralForCausalLM`) at 2 layers x 64 wide, with a tokenizer carrying the family's control tokens
under their real names (`<think>`/`</think>` and `<tool_call>` as added, non-special tokens in Qwen3;
`<|eot_id|>`, `<|python_tag|>` special in Llama; `[TOOL_CALLS]`, `[INST]` special in Mistral) and a chat
template written here (`templates/*.jinja`) to put thinking, tools, calls and tool results where the
family's own template puts them. Departures: the text vocabulary is the tiny chat model's byte-level
BPE for all four (Mistral's own is sentencepiece); the Qwen3 model is a thinking one (its generation
prompt opens `<think>`, as Qwen3-*-Thinking-2507's does), the MoE one hybrid (the model opens it).
Weights are random: answers are noise, so tests make them write calls through constrained decoding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).with_name("templates")
INIT_RANGE = 0.02


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str
    template: str
    rename: dict[str, str]
    """The tiny tokenizer's 5 own tokens (<|endoftext|>, <|im_start|>, <|im_end|>, <tool_call>, </tool_call>)
    -> the family's, keeping their ids."""
    special: tuple[str, ...]
    """Further control tokens (special: decoded only where a parser keeps them)."""
    plain: tuple[str, ...]
    """Further added tokens that are text (survive skip_special_tokens)."""
    bos: str | None
    eos: str
    pad: str
    eos_ids: tuple[str, ...] = ()
    """Other tokens that end a turn (generation_config.eos_token_id)."""
    thinking_mode: str = ""


FAMILIES = {
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "qwen3.jinja", {}, (),
                    ("<tool_response>", "</tool_response>", "<think>", "</think>"),
                    None, "<|im_end|>", "<|endoftext|>", thinking_mode="always"),
    "qwen3_moe": Family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3.jinja", {}, (),
                        ("<tool_response>", "</tool_response>", "<think>", "</think>"),
                        None, "<|im_end|>", "<|endoftext|>", thinking_mode="hybrid"),
    "llama": Family("llama", "LlamaForCausalLM", "llama3.jinja",
                    {"<|endoftext|>": "<|begin_of_text|>", "<|im_start|>": "<|start_header_id|>",
                     "<|im_end|>": "<|eot_id|>", "<tool_call>": "<|python_tag|>", "</tool_call>": "<|end_header_id|>"},
                    ("<|end_of_text|>", "<|eom_id|>", "<|finetune_right_pad_id|>"), (),
                    "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>",
                    eos_ids=("<|end_of_text|>", "<|eom_id|>")),
    "mistral": Family("mistral", "MistralForCausalLM", "mistral.jinja",
                      {"<|endoftext|>": "<unk>", "<|im_start|>": "<s>", "<|im_end|>": "</s>",
                       "<tool_call>": "[INST]", "</tool_call>": "[/INST]"},
                      ("[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
                      (), "<s>", "</s>", "<unk>"),
}


def chat_template(family: Family) -> str:
    text = (TEMPLATES / family.template).read_text()
    return text.replace("THINKING_MODE", family.thinking_mode) if family.thinking_mode else text


def family_tokenizer(family: Family) -> Any:
    """The tiny byte-level BPE with the family's control tokens under their real names."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    from clawloop.tinymodel.build import _tokenizer_json

    spec = json.loads(_tokenizer_json())
    vocab = spec["model"]["vocab"]
    for t in spec["added_tokens"]:
        new = family.rename.get(t["content"])
        if new is not None:
            if t["content"] in vocab:  # special tokens are in the BPE vocabulary too, added ones are not
                vocab[new] = vocab.pop(t["content"])
            t["content"], t["special"] = new, True
    tk = Tokenizer.from_str(json.dumps(spec))
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in family.special])
    tk.add_tokens([AddedToken(s, special=False, normalized=False) for s in family.plain])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=family.bos, eos_token=family.eos,
                                  pad_token=family.pad, unk_token=family.pad, model_max_length=4096,
                                  padding_side="left", clean_up_tokenization_spaces=False)
    tok.chat_template = chat_template(family)
    return tok


def _config(family: Family, tok: Any, layers: int, hidden: int) -> Any:
    import transformers

    heads = 2
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=1, max_position_embeddings=4096,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, initializer_range=INIT_RANGE,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if family.name == "qwen3":
        return transformers.Qwen3Config(head_dim=hidden // heads, **common)
    if family.name == "qwen3_moe":
        return transformers.Qwen3MoeConfig(head_dim=hidden // heads, moe_intermediate_size=hidden // 2, num_experts=4,
                                           num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], **common)
    if family.name == "llama":
        return transformers.LlamaConfig(head_dim=hidden // heads, **common)
    return transformers.MistralConfig(head_dim=hidden // heads, sliding_window=None, **common)


def _save_tokenizer(tok: Any, family: Family, out: Path) -> None:
    tok.save_pretrained(str(out), save_jinja_files=False)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = chat_template(family)
    cfg.pop("extra_special_tokens", None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def build_family_model(family: str, out: str | Path, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """A random tiny model of `family` (one of FAMILIES) in HF format at `out` (written atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from clawloop.tinymodel.build import _write_atomically

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (one of {', '.join(FAMILIES)})")
    f = FAMILIES[family]
    t0 = time.perf_counter()
    tok = family_tokenizer(f)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(f, tok, layers, hidden)).eval()
    assert type(model).__name__ == f.architecture, type(model).__name__
    eos = [tok.eos_token_id] + [tok.convert_tokens_to_ids(t) for t in f.eos_ids]
    model.generation_config = GenerationConfig(eos_token_id=eos if len(eos) > 1 else eos[0],
                                               pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)

    def write(d: Path) -> None:
        model.save_pretrained(str(d), safe_serialization=True)
        _save_tokenizer(tok, f, d)
        info = {"name": f"tiny-{family}-random", "architecture": f.architecture, "seed": seed,
                "params": sum(p.numel() for p in model.parameters()), "build_s": round(time.perf_counter() - t0, 2)}
        (d / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")

    return _write_atomically(Path(out), write, force=True)


if __name__ == "__main__":  # python -m clawloop.tinymodel.families FAMILY OUT_DIR
    import sys

    t = time.perf_counter()
    print(build_family_model(sys.argv[1], sys.argv[2]), f"{time.perf_counter() - t:.1f} s")

"""The tiny model's tokenizer and chat template.

A byte-level BPE trained locally with `tokenizers` (digits split one per token,
so arithmetic sees every digit), ChatML special tokens, and a Qwen-like Jinja
chat template that renders tools, tool calls and tool results. It is saved as
a standard `PreTrainedTokenizerFast`, so `AutoTokenizer.from_pretrained` and
vLLM load it like any Hugging Face tokenizer.

Departures from Qwen2.5's template: no default system prompt, a shorter tools
header, and tool results as their own `<|im_start|>tool` block rather than
`<tool_response>` inside a user block.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
PAUSE = "<|pause|>"
"""A model built with pauses (`chat_template(pauses)`) has this special token after every assistant header:
positions to compute in before the answer's first token (Goyal et al. 2023, "Think before you speak:
training language models with pause tokens"); never generated (the loss mask leaves it out)."""
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
ADDED_TOKENS = (TOOL_OPEN, TOOL_CLOSE)
"""Added but not special: they survive `skip_special_tokens=True`, so tool calls decode into text."""
VOCAB_SIZE = 1536

# Qwen2's pre-tokenizer, byte for byte: it splits digits one per token (`\p{N}`),
# and transformers 5.x loads any `qwen2` checkpoint's tokenizer through
# `Qwen2Tokenizer`, which rebuilds exactly this normalizer and pre-tokenizer. Using
# them here makes the saved tokenizer.json and that rebuild tokenize identically.
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")

TOOLS_HEADER = "# Tools\n\nYou may call these functions:\n<tools>"
TOOLS_FOOTER = ("\n</tools>\nTo call one, reply with:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <arguments-json>}\n</tool_call>')

CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is not none -%}"
    "{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set has_system = messages and messages[0].role in ('system', 'developer') -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system and text(messages[0].content) -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- " + json.dumps(TOOLS_HEADER) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + json.dumps(TOOLS_FOOTER) + " + '<|im_end|>\\n' -}}"
    "{%- elif has_system -%}"
    "{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and has_system -%}"
    "{%- elif message.role in ('system', 'developer') -%}"
    "{{- '<|im_start|>system\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set content = text(message.content) -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- if message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


_ASSISTANT_OPEN = "'<|im_start|>assistant\\n'"


def chat_template(pauses: int = 0) -> str:
    """The chat template; with `pauses` > 0, that many `PAUSE` tokens after every assistant header (the
    history's assistant messages and the generation prompt alike, so a conversation renders the same
    prefix turn after turn)."""
    if pauses < 0:
        raise ValueError(f"pauses must be >= 0, got {pauses}")
    return CHAT_TEMPLATE.replace(_ASSISTANT_OPEN, _ASSISTANT_OPEN[:-1] + PAUSE * pauses + "'")


@lru_cache(maxsize=4)
def _compiled_template(template: str = CHAT_TEMPLATE):
    """A chat template compiled the way transformers compiles it (sandboxed,
    trim/lstrip blocks, a non-escaping `tojson`), for rendering a corpus fast."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    return env.from_string(template)


def render_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = False, template: str | None = None) -> str:
    """The prompt text, identical to `tokenizer.apply_chat_template(..., tokenize=False)` (with `template`,
    that tokenizer's `chat_template`; default: the template without pauses)."""
    return _compiled_template(template or CHAT_TEMPLATE).render(messages=messages, tools=tools,
                                                                add_generation_prompt=add_generation_prompt)


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE (`tokenizers.Tokenizer`) trained on `texts`. Special-token
    strings in `texts` are ignored for training; the special tokens take ids 0, 1, 2
    and the added tool-call tokens the last two ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS), special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False, min_frequency=2)

    def clean():
        for t in texts:
            for s in SPECIAL_TOKENS + ADDED_TOKENS:
                t = t.replace(s, "\n")
            yield t

    tok.train_from_iterator(clean(), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED_TOKENS])
    return tok


def wrap_tokenizer(tok, pauses: int = 0) -> Any:
    """A transformers fast tokenizer around a trained `tokenizers.Tokenizer`, with the chat template
    (`chat_template(pauses)`; with pauses the `PAUSE` special token is added, the last id)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    if pauses:
        tok.add_special_tokens([AddedToken(PAUSE, special=True, normalized=False)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, unk_token=PAD,
                                 additional_special_tokens=[IM_START] + ([PAUSE] if pauses else []),
                                 model_max_length=2048, padding_side="left", clean_up_tokenization_spaces=False)
    hf.chat_template = chat_template(pauses)
    return hf


def save_tokenizer(hf_tokenizer: Any, out: str | Path) -> None:
    """Save with the chat template inside tokenizer_config.json and a class name
    both transformers 4.x and 5.x resolve (5.x writes `TokenizersBackend`)."""
    out = Path(out)
    hf_tokenizer.save_pretrained(str(out), save_jinja_files=False)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = hf_tokenizer.chat_template or CHAT_TEMPLATE
    # 5.x writes a list under `extra_special_tokens`; 4.x expects a dict there but reads this list.
    cfg.pop("extra_special_tokens", None)
    cfg["additional_special_tokens"] = [IM_START] + ([PAUSE] if PAUSE in hf_tokenizer.get_vocab() else [])
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")

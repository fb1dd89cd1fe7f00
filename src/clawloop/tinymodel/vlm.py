"""A tiny random vision-language model for tests: a Qwen2-VL built locally in seconds (no download).

    from clawloop.tinymodel.vlm import build_tiny_vlm
    build_tiny_vlm(out_dir)            # config, random weights, tokenizer, image processor

The text side is the tiny chat model's byte-level BPE with Qwen2-VL's vision tokens added as special
tokens (`<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`) and the tiny chat
template taught to render image parts (`{"type": "image_url"}` or `{"type": "image"}`) as
`<|vision_start|><|image_pad|><|vision_end|>`, as Qwen2-VL's template does. The vision side is a
2-block ViT (14 px patches, 2x2 merge) and the image processor is limited to 4-16 merged tokens per
image (`min_pixels`/`max_pixels`), so a 160x210 screenshot becomes 12 placeholder tokens.

The folder has what a Qwen2-VL checkpoint has: `config.json` (`qwen2_vl`), safetensors weights,
`tokenizer.json` + `tokenizer_config.json` (with the chat template), `preprocessor_config.json`
(`Qwen2VLImageProcessor`) and `generation_config.json`. Weights are random: the answers are noise.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from clawloop.tinymodel.tokenizer import CHAT_TEMPLATE, IM_END, IM_START, PAD

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
MIN_PIXELS = 28 * 28 * 4
"""At least 4 merged tokens per image (a 28x28 area each)."""
MAX_PIXELS = 28 * 28 * 16
"""At most 16 merged tokens per image."""
INIT_RANGE = 0.2
"""Weight init std: 10x the usual, so the random model's answers depend on the image and the text (at
0.02 every input greedily gives the same token)."""

_TEXT_PARTS = "{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}"
_VL_PARTS = ("{%- for part in content -%}"
             "{%- if part.type == 'text' -%}{{- part.text -}}"
             "{%- elif part.type in ('image', 'image_url') -%}{{- '" + VISION_START + IMAGE_PAD + VISION_END + "' -}}"
             "{%- endif -%}"
             "{%- endfor -%}")
assert _TEXT_PARTS in CHAT_TEMPLATE
VL_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(_TEXT_PARTS, _VL_PARTS)
"""The tiny chat template, with image parts rendered as Qwen2-VL renders them."""


def vlm_tokenizer() -> Any:
    """The tiny model's tokenizer plus the vision special tokens, with the VL chat template."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    from clawloop.tinymodel.build import _tokenizer_json

    tk = Tokenizer.from_str(_tokenizer_json())
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in VISION_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=IM_END, pad_token=PAD, unk_token=PAD,
                                  additional_special_tokens=[IM_START, *VISION_TOKENS], model_max_length=2048,
                                  padding_side="left", clean_up_tokenization_spaces=False)
    tok.chat_template = VL_CHAT_TEMPLATE
    return tok


def _config(tok: Any, layers: int, hidden: int) -> Any:
    from transformers import Qwen2VLConfig

    heads = max(1, hidden // 32)
    half = hidden // heads // 2  # rotary pairs per head, split over (time, height, width)
    section = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    return Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
            rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            initializer_range=INIT_RANGE),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3, initializer_range=INIT_RANGE),
        initializer_range=INIT_RANGE,
        image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD], vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END], tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def _save_tokenizer(tok: Any, out: Path) -> None:
    """As `tinymodel.tokenizer.save_tokenizer`, with the vision tokens and the VL template."""
    tok.save_pretrained(str(out), save_jinja_files=False)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = VL_CHAT_TEMPLATE
    cfg.pop("extra_special_tokens", None)
    cfg["additional_special_tokens"] = [IM_START, *VISION_TOKENS]
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def build_tiny_vlm(out: str | Path, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """A random tiny Qwen2-VL in HF format at `out` (written atomically; replaces what is there)."""
    import torch
    from transformers import GenerationConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from clawloop.tinymodel.build import _write_atomically

    t0 = time.perf_counter()
    out = Path(out)
    tok = vlm_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(_config(tok, layers, hidden)).eval()
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=None)
    # The PIL image processor needs no torchvision; it saves as `Qwen2VLImageProcessor`, which loads the
    # torchvision one where that is installed (the same resize rule and normalisation).
    images = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)

    def write(d: Path) -> None:
        model.save_pretrained(str(d), safe_serialization=True)
        _save_tokenizer(tok, d)
        images.save_pretrained(str(d))
        info = {"name": "tiny-vlm-random", "architecture": "Qwen2VLForConditionalGeneration", "seed": seed,
                "params": sum(p.numel() for p in model.parameters()),
                "build_s": round(time.perf_counter() - t0, 2)}
        (d / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")

    return _write_atomically(out, write, force=True)


if __name__ == "__main__":  # python -m clawloop.tinymodel.vlm OUT_DIR
    import sys

    t = time.perf_counter()
    print(build_tiny_vlm(sys.argv[1] if len(sys.argv) > 1 else "tiny-vlm"), f"{time.perf_counter() - t:.1f} s")

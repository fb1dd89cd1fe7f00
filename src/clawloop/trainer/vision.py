"""Pixel inputs for training a vision-language policy (Qwen2-VL and its kin) on the turns it served.

    images = SampleImages.for_model(model, model_path, images_dir)    # None for a text model
    kept, stats = images.keep_loadable(samples)                       # samples whose images are all at hand
    mm = images.batch_inputs(samples, tokens)                         # pixel_values, image_grid_thw, mm_token_type_ids

A VLM sample's prompt ids hold the image placeholders exactly as they were served: each image's
`<|image_pad|>` repeated once per merged patch (the gateway's `expand_images`). The trainer never
rebuilds those ids, nor anything else from text. It rebuilds only the pixel inputs: each image part of
the sample's messages names its bytes by sha256 (`clawloop-image://<sha256>.<ext>`; capture writes the
file once to `DATA_DIR/images`, a GUI rollout too), the bytes are checked against that hash and go
through the model's own image processor, the one the engine used, so the pixels are the served ones.
Each image's placeholder run in the prompt must have the length its processed grid gives; a sample
whose image is missing, altered or does not fit its run is skipped (`train/image_samples_skipped`, a
warning naming the reason), never trained on a guess. A sample that sampled the placeholder id in its
response is skipped too: the model would read it as an image slot.

The model computes its M-RoPE positions from `mm_token_type_ids` (1 on image tokens) and the grids, as
the engine's prefill does, so the trainer's logprobs are the served ones (tests/test_train_vlm.py).
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from clawloop.gateway.protocol import IMAGE_REF
from clawloop.records import Sample

log = logging.getLogger(__name__)

CACHE_BYTES = 256 * 1024 * 1024
"""Processed images kept between steps (an agent's turns resend its earlier screenshots)."""


class MissingImage(ValueError):
    """A sample's image cannot be had as it was served (the reason is the message)."""


def vision_model_class(path: str | Path) -> Any:
    """`AutoModelForImageTextToText` for a folder whose model type is an image-text-to-text one with no
    causal-LM class (Qwen2-VL and its kin) or with an image processor beside it; else None. The rule the
    hf engine loads its model by, so the trainer trains the class the engine serves."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    p = Path(path)
    if not (p / "config.json").exists():
        return None
    model_type = getattr(AutoConfig.from_pretrained(str(p)), "model_type", None)
    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return None
    has_processor = any((p / f).exists() for f in ("preprocessor_config.json", "processor_config.json"))
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not has_processor:
        return None
    return transformers.AutoModelForImageTextToText


def image_refs(messages: list[dict[str, Any]] | None) -> list[str]:
    """The stored images' file names (`<sha256>.<ext>`) of the messages' image parts, in the order the
    chat template renders them. A part that names no stored image (a URL, a marker) is named as it is,
    so the count stays right and loading it fails with its name."""
    out: list[str] = []
    for m in messages or []:
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for p in content:
            if isinstance(p, dict) and p.get("type") in ("image_url", "image"):
                url = str((p.get("image_url") or {}).get("url", "")) if isinstance(p.get("image_url"), dict) else ""
                out.append(url[len(IMAGE_REF):] if url.startswith(IMAGE_REF) else url or "(an image part with no url)")
    return out


def placeholder_runs(ids: list[int], token_id: int) -> list[int]:
    """Lengths of the runs of `token_id` in `ids`, in order."""
    runs: list[int] = []
    prev = False
    for t in ids:
        here = t == token_id
        if here and prev:
            runs[-1] += 1
        elif here:
            runs.append(1)
        prev = here
    return runs


class SampleImages:
    """Loads, checks and processes the stored images of a VLM's samples; see the module docstring."""

    def __init__(self, image_processor: Any, image_token_id: int, images_dir: str | Path | None):
        self.processor = image_processor
        self.token_id = int(image_token_id)
        self.merge = int(getattr(image_processor, "merge_size", 1) or 1)
        self.images_dir = Path(images_dir) if images_dir is not None else None
        self._cache: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self._cache_bytes = 0
        self.skipped = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module, model_path: str | Path,
                  images_dir: str | Path | None) -> "SampleImages":
        """From the model's config (`image_token_id`) and its folder's image processor; a folder without
        one is an error here (the engine could not have served images either)."""
        from transformers import AutoImageProcessor

        token_id = getattr(model.config, "image_token_id", None)
        if token_id is None:
            raise ValueError(f"{model_path}: an image-text model whose config names no image_token_id")
        try:
            proc = AutoImageProcessor.from_pretrained(str(model_path))
        except Exception as e:  # noqa: BLE001 - any loading failure says the same thing
            raise ValueError(f"{model_path}: the image processor could not be loaded ({e})") from e
        return cls(proc, int(token_id), images_dir)

    # -- one image ---------------------------------------------------------------
    def _load(self, name: str) -> dict[str, torch.Tensor]:
        """One stored image's pixel inputs (cached by name, which is its content)."""
        hit = self._cache.get(name)
        if hit is not None:
            self._cache.move_to_end(name)
            return hit
        from PIL import Image

        sha = name.split(".", 1)[0]
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise MissingImage(f"image part {name!r} names no stored image (clawloop-image://<sha256>.<ext>)")
        if self.images_dir is None:
            raise MissingImage(f"image {name}: no images folder (the store has no data dir)")
        path = self.images_dir / name
        try:
            data = path.read_bytes()
        except OSError:
            raise MissingImage(f"image {name} is not in {self.images_dir}") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise MissingImage(f"image {path}: its bytes do not hash to its name")
        try:
            with Image.open(io.BytesIO(data)) as im:
                img = im.convert("RGB")
        except Exception as e:  # noqa: BLE001
            raise MissingImage(f"image {path} could not be decoded ({type(e).__name__})") from None
        out = {k: v for k, v in self.processor(images=[img], return_tensors="pt").items()
               if isinstance(v, torch.Tensor) and k in ("pixel_values", "image_grid_thw")}
        size = sum(t.numel() * t.element_size() for t in out.values())
        self._cache[name] = out
        self._cache_bytes += size
        while self._cache_bytes > CACHE_BYTES and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= sum(t.numel() * t.element_size() for t in old.values())
        return out

    # -- one sample ----------------------------------------------------------------
    def sample_inputs(self, s: Sample) -> list[dict[str, torch.Tensor]]:
        """The pixel inputs of each image of `s`, in prompt order ([] for a text sample); MissingImage when
        one cannot be had or does not fit its placeholder run."""
        runs = placeholder_runs(s.tokens[:s.prompt_len], self.token_id)
        if self.token_id in s.tokens[s.prompt_len:]:
            raise MissingImage("the response holds the image placeholder id (the model would read it as an image)")
        refs = image_refs(s.messages)
        if not runs:
            return []
        if len(refs) != len(runs):
            raise MissingImage(f"the prompt holds {len(runs)} image(s) and its messages name {len(refs)}")
        out = []
        for k, (name, n) in enumerate(zip(refs, runs)):
            pix = self._load(name)
            want = int(pix["image_grid_thw"][0].prod()) // self.merge ** 2
            if want != n:
                raise MissingImage(f"image {k} ({name}) takes {want} placeholder tokens, the prompt holds {n}")
            out.append(pix)
        return out

    def keep_loadable(self, samples: list[Sample]) -> tuple[list[Sample], dict[str, float]]:
        """The samples whose images are all at hand (each loaded once here), and the count skipped."""
        kept, skipped, reasons = [], 0, []
        for s in samples:
            try:
                self.sample_inputs(s)
            except MissingImage as e:
                skipped += 1
                reasons.append(f"turn {s.turn_id}: {e}" if s.turn_id is not None else str(e))
                continue
            kept.append(s)
        if skipped:
            self.skipped += skipped
            log.warning("%d of %d samples skipped: their images cannot be had as served (train/image_samples_skipped)"
                        "; first: %s", skipped, len(samples), reasons[0])
        n_img = sum(len(placeholder_runs(s.tokens[:s.prompt_len], self.token_id)) for s in kept)
        return kept, {"train/image_samples_skipped": float(skipped), "train/images": float(n_img)}

    def batch_inputs(self, samples: list[Sample], tokens: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """The model's image inputs for one micro-batch whose (B, L) `tokens` are `samples` in row order:
        `pixel_values` and `image_grid_thw` of every image, row by row (the order the model fills the
        placeholders in), and `mm_token_type_ids` (B, L) for its M-RoPE positions. None without images."""
        per = [p for s in samples for p in self.sample_inputs(s)]
        if not per:
            return None
        dev = tokens.device
        return {"pixel_values": torch.cat([p["pixel_values"] for p in per]).to(dev),  # (patches, C*T*P*P)
                "image_grid_thw": torch.cat([p["image_grid_thw"] for p in per]).to(dev),  # (n_images, 3)
                "mm_token_type_ids": (tokens == self.token_id).to(torch.int32)}  # (B, L)

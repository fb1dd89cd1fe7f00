"""In-process transformers engine with continuous batching and hitless weight swaps.

The model runs on one worker thread so the event loop never blocks. Requests
join a running batch at the next decode step: newcomers are prefilled as a
small batch of their own, then their KV cache is left-padded and concatenated
onto the running one (positions come from each row's own count, so padding
never shifts a row). Finished or cancelled rows are dropped from the cache at
once and all-padding columns are trimmed.

Weight publishes never pause serving. Every batch belongs to a *cohort*: a
model copy and the policy version it holds. `publish` loads the new weights
into a spare copy off the worker thread, then makes it the current cohort;
rows in flight keep decoding on their old cohort until they finish, new rows
go to the new one, and the worker steps both. Memory cost: a second copy of
the weights while an old cohort drains — fine for the CPU models this engine
is for; big GPU models belong on vLLM.

4-bit (`load_in_4bit`, QLoRA: `clawloop.quant`): the base is loaded NF4 the
way the trainer loads it and never changes; `publish` takes the trainer's LoRA
adapter (`accepts_lora_adapters`) and wraps it over a copy of the module tree
that shares every base tensor, so a publish costs the adapter's bytes and the
engine computes what the trainer computed. Full weights are refused: they
would have to be requantized, and would no longer be the trained model.

Logprobs are log_softmax of the raw logits (temperature 1) at the sampled id,
the quantity the trainer recomputes; temperature/top-p shape sampling only.

Images. A model folder with an image processor (`preprocessor_config.json`) whose
model type is an image-text-to-text one (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: loaded
with `AutoModelForImageTextToText`) is served with `supports_images`. The gateway
renders the prompt with one `<|image_pad|>` per image (the chat template's) and
calls `prepare_images`: each placeholder is expanded to the ids the model's
processor expands it to (Qwen: one per merged patch), and those expanded ids are
what the engine sees and capture stores; the pixel inputs ride on the request
(`GenerationRequest.multimodal`) and enter the prefill only. Prefill positions
come from the model's own `get_rope_index` (M-RoPE: 3-D positions over the
image grid); each row keeps its rope delta, so decoding continues at
`tokens so far + delta`, exactly what `generate` does. Per-image processing is
cached by content (an agent resends its earlier screenshots every turn).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import hashlib
import io
import itertools
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import torch

from clawloop.engines.base import GenerationRequest, ImageInputError, LoraAdapter, SamplingParams, TokenEvent
from clawloop.quant import load_4bit, shared_copy

log = logging.getLogger(__name__)


@dataclass
class _Row:
    req: GenerationRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    n_real: int = 0
    """Real (non-padding) tokens in this row's KV cache so far."""
    generated: int = 0
    next_token: int | None = None
    cancelled: bool = False
    done: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    matcher: Any = None
    """The row's grammar matcher when its request has a constraint."""
    anchors: tuple[str, ...] = ()
    """Where JSON starts in a constrained row's output (`grammar.json_anchors`), for closing in time."""
    ids: list[int] = field(default_factory=list)
    """A constrained row's sampled ids so far (closing in time reads their text)."""
    counts: torch.Tensor | None = None
    """(V,) how often each id was generated so far, for presence/frequency penalties."""
    pos_delta: int = 0
    """Rope position minus token count after the prompt (M-RoPE models with images: the image grid takes
    fewer positions than tokens)."""


@dataclass
class _Cohort:
    model: torch.nn.Module
    version: int
    rows: list[_Row] = field(default_factory=list)
    cache: Any = None
    mask: torch.Tensor | None = None  # (B, L) 1 for real tokens, 0 for left padding
    waiting: list[_Row] = field(default_factory=list)


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_state_dict_from_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """Weights of a HF folder (safetensors or torch .bin shards)."""
    from safetensors.torch import load_file

    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    sd: dict[str, torch.Tensor] = {}
    if files:
        for f in files:
            sd.update(load_file(str(f)))
        return sd
    for f in sorted(path.glob("pytorch_model*.bin")):
        sd.update(torch.load(f, map_location="cpu", weights_only=True))
    if not sd:
        raise FileNotFoundError(f"no weights (*.safetensors or pytorch_model*.bin) in {path}")
    return sd


IMAGE_CACHE_BYTES = 256 * 1024 * 1024
"""Processed images kept for reuse (an agent resends its earlier screenshots every turn)."""


def _has_image_processor(path: Path) -> bool:
    return any((path / f).exists() for f in ("preprocessor_config.json", "processor_config.json"))


class HFEngine:
    """Continuous-batching transformers engine; see the module docstring."""

    def __init__(self, model_path: str | Path, *, device: str = "auto", dtype: str = "auto",
                 max_batch_size: int = 32, max_model_len: int = 2048, threads: int = 0,
                 policy_version: int = 0, admit_wait_ms: float = 0.0, load_in_4bit: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = str(model_path)
        self.device = _resolve_device(device)
        self.dtype = _resolve_dtype(dtype, self.device)
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.threads = threads
        self.admit_wait_s = admit_wait_ms / 1000.0
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.supports_images = False
        """True when the served model takes images (see the module docstring)."""
        self.images_unsupported_reason = "the served model takes text only"
        self.image_token_id: int | None = None
        self._image_processor: Any = None
        self._merge_size = 1
        self._image_cache: collections.OrderedDict[str, tuple[list[int], dict[str, torch.Tensor]]] = \
            collections.OrderedDict()
        self._image_cache_bytes = 0
        self._image_lock = threading.Lock()
        vision_cls = self._vision_model_class()
        self._vision = vision_cls is not None
        """Loaded as an image-text-to-text model (whether or not images can be taken)."""
        self._model_cls: Any = vision_cls or AutoModelForCausalLM
        self.accepts_lora_adapters = bool(load_in_4bit)
        """4-bit: `publish` takes LoRA adapters (module docstring); else full weights."""
        model = (load_4bit(self._model_cls, self.model_path, self.dtype, self.device) if load_in_4bit
                 else self._model_cls.from_pretrained(self.model_path, dtype=self.dtype).to(self.device))
        self._base = model if load_in_4bit else None
        """The 4-bit base every published adapter wraps (shared, never changed)."""
        if self._vision:
            self._setup_images(model)
        model.eval()
        model.requires_grad_(False)
        self._current = _Cohort(model=model, version=policy_version)
        self._cohorts: list[_Cohort] = [self._current]
        self._spare: torch.nn.Module | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._running = False
        self._publish_lock = asyncio.Lock()
        self._ids = itertools.count()
        eos = self.tokenizer.eos_token_id
        gen_cfg = getattr(model, "generation_config", None)
        eos_ids = set()
        for e in (eos, getattr(gen_cfg, "eos_token_id", None)):
            if isinstance(e, int):
                eos_ids.add(e)
            elif isinstance(e, (list, tuple)):
                eos_ids.update(int(x) for x in e)
        self.eos_token_ids = frozenset(eos_ids)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._grammars: Any = None
        # Counters for /metrics and benchmarks.
        self.tokens_generated = 0
        self.steps = 0
        self.prefills = 0
        self.publishes = 0
        self.last_publish_s = 0.0

    @classmethod
    def from_config(cls, cfg: Any) -> "HFEngine":
        from clawloop.naming import model_path

        path = model_path(cfg)
        if not Path(path).exists():
            raise FileNotFoundError(
                f"model.path: {path} does not exist (build the tiny model with `clawloop tiny-model`, "
                "or pass --model-path)")
        return cls(path, device=cfg.model.device, dtype=cfg.model.dtype, max_batch_size=cfg.model.max_batch_size,
                   admit_wait_ms=cfg.model.admit_wait_ms,
                   max_model_len=cfg.model.max_model_len, threads=cfg.model.threads,
                   load_in_4bit=cfg.model.load_in_4bit)

    # -- images ----------------------------------------------------------
    def _vision_model_class(self) -> Any:
        """`AutoModelForImageTextToText` for an image-text-to-text model type that either has no causal-LM
        class (Qwen2-VL and its kin) or comes with an image processor; else None (the text path as ever)."""
        import transformers
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                            MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

        path = Path(self.model_path)
        if not (path / "config.json").exists():
            return None
        model_type = getattr(AutoConfig.from_pretrained(self.model_path), "model_type", None)
        if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
            return None
        if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not _has_image_processor(path):
            return None
        return transformers.AutoModelForImageTextToText

    def _setup_images(self, model: torch.nn.Module) -> None:
        """Find the image processor and the placeholder id; set `supports_images` when the model is one
        this engine serves images for (else say why not)."""
        from transformers import AutoImageProcessor, AutoProcessor

        path = Path(self.model_path)
        if not callable(getattr(getattr(model, "model", None), "get_rope_index", None)):
            # Only the Qwen-VL family (M-RoPE positions from `get_rope_index`) is verified on this engine.
            self.images_unsupported_reason = (f"the hf engine takes images for Qwen-VL-family models only for now "
                                              f"(this is {model.config.model_type!r})")
            return
        if not _has_image_processor(path):
            self.images_unsupported_reason = ("the served model's folder has no image processor "
                                              "(preprocessor_config.json)")
            return
        processor = None
        try:
            processor = AutoProcessor.from_pretrained(self.model_path)
        except Exception as e:  # e.g. Qwen2-VL's processor: its video part needs torchvision; images do not
            log.info("AutoProcessor unavailable for %s (%s: %s); using AutoImageProcessor", self.model_path,
                     type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
        image_processor = getattr(processor, "image_processor", None)
        if image_processor is None and processor is not None and not hasattr(processor, "tokenizer"):
            image_processor = processor  # AutoProcessor gave the image processor itself
        if image_processor is None:
            try:
                image_processor = AutoImageProcessor.from_pretrained(self.model_path)
            except Exception as e:
                self.images_unsupported_reason = f"the served model's image processor could not be loaded ({e})"
                log.warning("images disabled for %s: %s", self.model_path, self.images_unsupported_reason)
                return
        token_id = getattr(model.config, "image_token_id", None)
        if token_id is None or not getattr(image_processor, "merge_size", None):
            self.images_unsupported_reason = ("the served model names no image token (config.image_token_id) or "
                                              "its image processor no merge_size")
            return
        if self.tokenizer.chat_template is None:  # a template shipped for the processor only
            template = getattr(processor, "chat_template", None)
            if template is None and (path / "chat_template.jinja").exists():
                template = (path / "chat_template.jinja").read_text()
            if template is None and (path / "chat_template.json").exists():
                template = json.loads((path / "chat_template.json").read_text()).get("chat_template")
            self.tokenizer.chat_template = template
        self._image_processor, self._merge_size = image_processor, int(image_processor.merge_size)
        self.image_token_id = int(token_id)
        self.supports_images = True
        self.images_unsupported_reason = ""

    def _image_inputs(self, data: Any, index: int) -> tuple[list[int], dict[str, torch.Tensor]]:
        """One image's placeholder expansion and pixel inputs (cached by content)."""
        from PIL import Image

        key = hashlib.sha256(data).hexdigest() if isinstance(data, (bytes, bytearray)) else None
        if key is not None:
            with self._image_lock:
                hit = self._image_cache.get(key)
                if hit is not None:
                    self._image_cache.move_to_end(key)
                    return hit
        try:
            if isinstance(data, (bytes, bytearray)):
                with Image.open(io.BytesIO(data)) as im:
                    img = im.convert("RGB")  # decodes the first frame (GIF: the first)
            else:
                img = data.convert("RGB")
        except Exception as e:
            raise ImageInputError(f"the image could not be decoded ({type(e).__name__})", index) from None
        inputs = self._image_processor(images=[img], return_tensors="pt")
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        # As Qwen-VL processors expand `<|image_pad|>`: one placeholder per merged patch.
        n = int(tensors["image_grid_thw"][0].prod()) // self._merge_size ** 2
        out = ([self.image_token_id] * n, tensors)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if key is not None and size <= IMAGE_CACHE_BYTES // 4:
            with self._image_lock:
                if key not in self._image_cache:
                    self._image_cache[key] = out
                    self._image_cache_bytes += size
                while self._image_cache_bytes > IMAGE_CACHE_BYTES:
                    _, (_, old) = self._image_cache.popitem(last=False)
                    self._image_cache_bytes -= sum(t.numel() * t.element_size() for t in old.values())
        return out

    def prepare_images(self, prompt_ids: list[int], images: list[Any]) -> tuple[list[int], dict[str, torch.Tensor]]:
        """`prompt_ids` with each image placeholder expanded, and the pixel inputs for
        `GenerationRequest.multimodal` (see `engines.base`). Blocking: run it off the event loop."""
        if not self.supports_images:
            raise ValueError(f"images are not supported: {self.images_unsupported_reason}")
        n = prompt_ids.count(self.image_token_id)
        if n != len(images):
            raise ValueError(f"the chat template rendered {n} image placeholder(s) for {len(images)} image(s)")
        per = [self._image_inputs(img, i) for i, img in enumerate(images)]
        ids: list[int] = []
        k = 0
        for t in prompt_ids:
            if t == self.image_token_id:
                ids.extend(per[k][0])
                k += 1
            else:
                ids.append(t)
        mm = {key: torch.cat([p[1][key] for p in per], dim=0) for key in per[0][1]} if per else {}
        return ids, mm

    # -- protocol --------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self._current.version

    @property
    def model(self) -> torch.nn.Module:
        """The model new requests are served from (read-only use)."""
        return self._current.model

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._thread = threading.Thread(target=self._run, name="clawloop-hf-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._running = False
        self._wake.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30)
            self._thread = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        async for events in self.generate_chunks(request):
            for ev in events:
                yield ev

    async def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[TokenEvent]]:
        """The row's events as they are ready: all that the worker delivered since the consumer last
        looked are one list (a gateway busy with other streams catches up in one chunk)."""
        if not self._running:
            raise RuntimeError("engine is not started")
        if len(request.prompt_ids) == 0:
            raise ValueError("empty prompt")
        if request.multimodal and not self.supports_images:
            raise ValueError(f"images are not supported: {self.images_unsupported_reason}")
        loop = asyncio.get_running_loop()
        p = request.params
        gen = None
        if p.seed is not None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(int(p.seed))
        row = _Row(req=request, loop=loop, out=asyncio.Queue(), generator=gen,
                   stop_ids=frozenset(p.stop_token_ids) | self.eos_token_ids)
        if p.constraint is not None:
            grammars = self.grammars()
            compiled = await loop.run_in_executor(None, grammars.compile, p.constraint)
            row.matcher = grammars.matcher(compiled)
            if p.close_within > 0:
                from clawloop.engines.grammar import json_anchors

                row.anchors = json_anchors(p.constraint)
        if p.logit_bias:
            bad = [t for t in p.logit_bias if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise ValueError(f"logit_bias: token ids {bad[:5]} are outside the vocabulary (size {self.vocab_size})")
        self._inbox.put(("row", row))
        self._wake.set()
        try:
            while True:
                ev: TokenEvent | BaseException = await row.out.get()
                events = []
                while True:
                    if isinstance(ev, BaseException):
                        raise ev
                    events.append(ev)
                    if ev.finish_reason is not None or row.out.empty():
                        break
                    ev = row.out.get_nowait()
                yield events
                if events[-1].finish_reason is not None:
                    return
        finally:
            row.cancelled = True  # harmless when done; aborts the row when the consumer left early

    async def publish(self, weights: Mapping[str, Any] | str | Path, version: int) -> None:
        """Load `weights` into a spare model copy off the worker thread, then make
        it current. Returns once new requests are served by `version`."""
        async with self._publish_lock:
            t0 = time.perf_counter()
            loop = asyncio.get_running_loop()
            model = await loop.run_in_executor(None, self._prepare_model, weights)
            fut: asyncio.Future = loop.create_future()
            self._inbox.put(("swap", (model, int(version), loop, fut)))
            self._wake.set()
            await fut
            self.publishes += 1
            self.last_publish_s = time.perf_counter() - t0

    def relabel(self, version: int) -> None:
        """Name the weights served now `version` (before serving starts: a fresh run on a store that
        already holds turns continues its numbering, so one version names one set of weights)."""
        self._current.version = int(version)

    def stats(self) -> dict[str, float]:
        return {
            "engine/active_rows": float(sum(len(c.rows) + len(c.waiting) for c in self._cohorts)),
            "engine/cohorts": float(len(self._cohorts)),
            "engine/tokens_generated": float(self.tokens_generated),
            "engine/decode_steps": float(self.steps),
            "engine/prefills": float(self.prefills),
            "engine/publishes": float(self.publishes),
            "engine/last_publish_s": self.last_publish_s,
            "engine/policy_version": float(self.policy_version),
            "engine/json_closing_tokens": float(self._grammars.closed_tokens if self._grammars is not None else 0),
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current served weights (shared tensors: do not modify)."""
        return self._current.model.state_dict()

    def grammars(self) -> Any:
        """The constrained-decoding helper (built on first use: it reads the whole vocabulary)."""
        if self._grammars is None:
            from clawloop.engines.grammar import Grammars

            self._grammars = Grammars(self.tokenizer, self.vocab_size, sorted(self.eos_token_ids))
        return self._grammars

    # -- weights -----------------------------------------------------------
    def _prepare_model(self, weights: Mapping[str, Any] | str | Path | LoraAdapter) -> torch.nn.Module:
        if self._base is not None:
            return self._adapter_model(weights)
        if isinstance(weights, LoraAdapter):
            raise ValueError("publish: this engine serves full weights (a LoRA adapter needs --load-in-4bit)")
        if isinstance(weights, (str, Path)):
            if self._vision:  # checkpoint names differ from module names: let transformers map them
                weights = self._model_cls.from_pretrained(str(weights), dtype=self.dtype).state_dict()
            else:
                weights = load_state_dict_from_dir(weights)
        spare, self._spare = self._spare, None
        if spare is None:
            spare = copy.deepcopy(self._current.model)
        missing, unexpected = spare.load_state_dict(dict(weights), strict=False)
        # Tied embeddings may legitimately be absent; anything else is a wrong checkpoint.
        missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"publish: weights do not match the model (missing={missing[:5]}, "
                             f"unexpected={unexpected[:5]})")
        spare.eval()
        return spare

    def _adapter_model(self, adapter: Any) -> torch.nn.Module:
        """The 4-bit base under `adapter`: peft's wrappers over a shared copy of the base (`quant.shared_copy`),
        the adapter's tensors loaded; the base and the models in flight stay as they are."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        if not isinstance(adapter, LoraAdapter):
            raise ValueError("publish: a 4-bit engine takes LoRA adapters only (full weights would be requantized, "
                             f"no longer the trained model), got {type(adapter).__name__}")
        known = set(LoraConfig.__dataclass_fields__)
        conf = LoraConfig(**{k: v for k, v in adapter.config.items() if k in known})
        conf.inference_mode = True
        model = get_peft_model(shared_copy(self._base), conf)
        res = set_peft_model_state_dict(model, dict(adapter.state_dict))
        if res.unexpected_keys or any("lora_" in k for k in res.missing_keys):
            raise ValueError(f"publish: the adapter does not fit the model (unexpected={res.unexpected_keys[:5]}, "
                             f"missing={[k for k in res.missing_keys if 'lora_' in k][:5]})")
        self._spare = None  # adapters need no spare: each publish wraps the shared base anew
        return model.eval().requires_grad_(False)

    # -- worker thread -----------------------------------------------------
    @staticmethod
    def _deliver(batch: list[tuple[_Row, TokenEvent]]) -> None:
        for row, ev in batch:
            row.out.put_nowait(ev)

    def _emit_many(self, batch: list[tuple[_Row, TokenEvent]]) -> None:
        """One wake-up per event loop per decode step, not one per token."""
        by_loop: dict[Any, list[tuple[_Row, TokenEvent]]] = {}
        for row, ev in batch:
            by_loop.setdefault(row.loop, []).append((row, ev))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._deliver, items)
            except RuntimeError:  # the consumers' loop is closed
                for row, _ in items:
                    row.cancelled = True

    def _emit(self, row: _Row, ev: TokenEvent | BaseException) -> None:
        try:
            row.loop.call_soon_threadsafe(row.out.put_nowait, ev)
        except RuntimeError:  # the consumer's loop is closed
            row.cancelled = True

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "row":
                self._current.waiting.append(item)
            elif kind == "swap":
                model, version, loop, fut = item
                self._current = _Cohort(model=model, version=version)
                self._cohorts.append(self._current)
                loop.call_soon_threadsafe(lambda f=fut: f.done() or f.set_result(None))

    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        while self._running:
            self._drain_inbox()
            busy = False
            for cohort in list(self._cohorts):
                try:
                    busy |= self._step_cohort(cohort)
                except Exception as e:  # fail the cohort's requests, keep the engine up
                    log.exception("engine step failed")
                    for row in cohort.rows + cohort.waiting:
                        self._emit(row, RuntimeError(f"generation failed: {e}"))
                    cohort.rows, cohort.waiting, cohort.cache, cohort.mask = [], [], None, None
            # Retire drained old cohorts; keep one spare model for the next publish.
            for cohort in list(self._cohorts):
                if cohort is not self._current and not cohort.rows and not cohort.waiting:
                    self._cohorts.remove(cohort)
                    if self._spare is None:
                        self._spare = cohort.model
            if not busy:
                self._wake.wait(timeout=0.05)
                self._wake.clear()
        for cohort in self._cohorts:
            for row in cohort.rows + cohort.waiting:
                self._emit(row, RuntimeError("engine stopped"))

    @torch.inference_mode()
    def _step_cohort(self, c: _Cohort) -> bool:
        c.waiting = [r for r in c.waiting if not r.cancelled]
        room = self.max_batch_size - len(c.rows)
        # While a batch decodes, newcomers may wait up to `admit_wait_s` to be prefilled
        # together: each prefill is a forward of its own beside the decode step.
        if c.waiting and room > 0 and (not c.rows or len(c.waiting) >= room
                                       or time.perf_counter() - c.waiting[0].submitted_at >= self.admit_wait_s):
            newcomers, c.waiting = c.waiting[:room], c.waiting[room:]
            self._prefill(c, newcomers)
        if not c.rows:
            return bool(c.waiting)
        self._decode(c)
        return True

    def _forward(self, model: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor,
                 positions: torch.Tensor, cache: Any, extra: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                    past_key_values=cache, use_cache=True, **(extra or {}))
        return out.logits[:, -1, :].float()  # (B, V)

    def _prefill(self, c: _Cohort, rows: list[_Row]) -> None:
        from transformers import DynamicCache

        lens = [len(r.req.prompt_ids) for r in rows]
        L = max(lens)
        ids = torch.full((len(rows), L), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), L), dtype=torch.long)
        for i, r in enumerate(rows):
            n = lens[i]
            ids[i, L - n:] = torch.tensor(r.req.prompt_ids, dtype=torch.long)
            mask[i, L - n:] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
        extra = self._pixel_inputs(c.model, rows, ids, mask)
        if extra is not None and "position_ids" in extra:
            positions = extra.pop("position_ids")
        cache = DynamicCache(config=c.model.config)
        self.prefills += 1
        logits = self._forward(c.model, ids.to(self.device), mask.to(self.device), positions.to(self.device), cache,
                               extra)
        for i, r in enumerate(rows):
            r.n_real = lens[i]
        self._merge(c, rows, cache, mask)
        self._sample_and_emit(c, rows, logits)

    def _pixel_inputs(self, model: torch.nn.Module, rows: list[_Row], ids: torch.Tensor,
                      mask: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """The prefill's pixel inputs (the rows' in row order: the model fills placeholders in that order)
        and its (3, B, L) M-RoPE positions; sets each row's `pos_delta`. None without images."""
        mm = [r.req.multimodal for r in rows if r.req.multimodal]
        if not mm:
            return None
        extra: dict[str, torch.Tensor] = {}
        for key in mm[0]:
            t = torch.cat([m[key] for m in mm], dim=0)
            extra[key] = (t.to(self.dtype) if t.is_floating_point() else t).to(self.device)
        # M-RoPE: text rows count 1, 2, 3...; an image's tokens take its grid's positions (fewer).
        kinds = (ids == self.image_token_id).to(torch.int32)
        pos, deltas = model.model.get_rope_index(ids, mm_token_type_ids=kinds,
                                                 image_grid_thw=extra["image_grid_thw"].cpu(), attention_mask=mask)
        for i, r in enumerate(rows):
            r.pos_delta = int(deltas[i])
        extra["position_ids"] = pos  # (3, B, L)
        return extra

    def _merge(self, c: _Cohort, rows: list[_Row], cache: Any, mask: torch.Tensor) -> None:
        if not c.rows:
            c.rows, c.cache, c.mask = list(rows), cache, mask
            return
        La, Lb = c.mask.shape[1], mask.shape[1]
        L = max(La, Lb)

        def lpad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
            if n == 0:
                return t
            shape = list(t.shape)
            shape[dim] = n
            return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

        for la, lb in zip(c.cache.layers, cache.layers):
            la.keys = torch.cat([lpad(la.keys, L - La, 2), lpad(lb.keys, L - Lb, 2)], dim=0)  # (B, H, L, D)
            la.values = torch.cat([lpad(la.values, L - La, 2), lpad(lb.values, L - Lb, 2)], dim=0)
        c.mask = torch.cat([lpad(c.mask, L - La, 1), lpad(mask, L - Lb, 1)], dim=0)  # (B, L)
        c.rows.extend(rows)

    def _decode(self, c: _Cohort) -> None:
        ids = torch.tensor([[r.next_token] for r in c.rows], dtype=torch.long)  # (B, 1)
        positions = torch.tensor([[r.n_real + r.pos_delta] for r in c.rows], dtype=torch.long)  # (B, 1)
        c.mask = torch.cat([c.mask, torch.ones((len(c.rows), 1), dtype=torch.long)], dim=1)  # (B, L+1)
        logits = self._forward(c.model, ids.to(self.device), c.mask.to(self.device), positions.to(self.device),
                               c.cache)
        for r in c.rows:
            r.n_real += 1
        self.steps += 1
        self._sample_and_emit(c, list(c.rows), logits)

    def _sample_and_emit(self, c: _Cohort, rows: list[_Row], logits: torch.Tensor) -> None:
        """Sample one token per row from `logits` (rows in the same order), emit it,
        then drop finished rows from the cohort's batch."""
        logprobs = torch.log_softmax(logits, dim=-1).cpu()  # (B, V)
        logits = logits.cpu()
        out: list[tuple[_Row, TokenEvent]] = []
        for i, r in enumerate(rows):
            if r.cancelled:
                r.done = True
                continue
            p = r.req.params
            try:
                tok, lp, top = self._choose(r, logits[i], logprobs[i])
            except Exception as e:  # one row's failure (a grammar dead end) ends that row only
                log.exception("sampling failed for one row")
                self._emit(r, RuntimeError(f"generation failed: {e}"))
                r.done = True
                continue
            r.generated += 1
            finish = None
            if tok in r.stop_ids or (r.matcher is not None and r.matcher.is_terminated()):
                finish = "stop"
            elif r.generated >= p.max_tokens or r.n_real + 1 >= self.max_model_len:
                finish = "length"
            if r.first_token_at is None:
                r.first_token_at = time.perf_counter()
            self.tokens_generated += 1
            out.append((r, TokenEvent(token_id=tok, logprob=lp, top_logprobs=top, finish_reason=finish,
                                      policy_version=c.version)))
            r.next_token = tok
            if finish is not None:
                r.done = True
        self._emit_many(out)
        keep = [i for i, r in enumerate(c.rows) if not (r.done or r.cancelled)]
        if len(keep) == len(c.rows):
            return
        if not keep:
            c.rows, c.cache, c.mask = [], None, None
            return
        idx = torch.tensor(keep, dtype=torch.long)
        c.rows = [c.rows[i] for i in keep]
        c.mask = c.mask[idx]
        dev_idx = idx.to(self.device)
        for layer in c.cache.layers:
            layer.keys = layer.keys[dev_idx]
            layer.values = layer.values[dev_idx]
        # Trim columns that are padding for every remaining row.
        first_real = int((c.mask.sum(0) > 0).nonzero()[0])
        if first_real > 0:
            c.mask = c.mask[:, first_real:]
            for layer in c.cache.layers:
                layer.keys = layer.keys[:, :, first_real:]
                layer.values = layer.values[:, :, first_real:]

    def _choose(self, r: _Row, logits: torch.Tensor, logprobs: torch.Tensor
                ) -> tuple[int, float, list[tuple[int, float]] | None]:
        """One row's next id, its logprob and the top alternatives. The grammar (if any) masks the
        distribution the logprobs are reported from; penalties and logit bias shape sampling only,
        in vLLM's order (mask, logprobs, penalties/bias, temperature, top-p)."""
        p = r.req.params
        if r.matcher is not None:
            logits = self.grammars().mask(r.matcher, logits)  # (V,)
            logprobs = torch.log_softmax(logits, dim=-1)
        shaped = logits
        if p.logit_bias or p.presence_penalty or p.frequency_penalty or r.generated < p.min_tokens:
            shaped = logits.clone()
            if r.generated < p.min_tokens:  # no end yet (vLLM's min_tokens): the stop ids cannot be sampled
                shaped[torch.tensor(sorted(r.stop_ids), dtype=torch.long)] = float("-inf")
            if p.logit_bias:
                ids = torch.tensor([int(t) for t in p.logit_bias], dtype=torch.long)
                shaped.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), dtype=shaped.dtype))
            if r.counts is not None:
                shaped -= p.presence_penalty * (r.counts > 0).to(shaped.dtype) + p.frequency_penalty * r.counts
        tok = self._closing_token(r, logits)
        if tok is None:
            tok = self._sample(shaped, p, r.generator)
        if not torch.isfinite(logprobs[tok]):
            raise RuntimeError("sampled an id the grammar forbids (all allowed ids have -inf logits?)")
        if r.matcher is not None and not r.matcher.accept_token(tok):
            raise RuntimeError(f"the grammar refused id {tok}")
        if r.anchors:
            r.ids.append(tok)
        if p.presence_penalty or p.frequency_penalty:
            if r.counts is None:
                r.counts = torch.zeros(logits.shape[-1], dtype=logits.dtype)
            r.counts[tok] += 1
        top = None
        if p.top_logprobs > 0:
            v, ix = torch.topk(logprobs, k=min(p.top_logprobs, logprobs.shape[-1]))
            top = [(int(a), float(b)) for a, b in zip(ix, v) if torch.isfinite(b)]
        return tok, float(logprobs[tok]), top

    def _closing_token(self, r: _Row, masked: torch.Tensor) -> int | None:
        """The token that closes a constrained row's open JSON when its budget is nearly spent (see
        SamplingParams.close_within), else None (sample as usual)."""
        p = r.req.params
        if not r.anchors or p.max_tokens - r.generated > p.close_within:
            return None
        from clawloop.engines.grammar import inside_json

        where = inside_json(self.tokenizer.decode(r.ids, skip_special_tokens=False), r.anchors)
        return None if where is None else self.grammars().closer(masked, where)

    @staticmethod
    def _sample(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        if p.temperature <= 0.0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / p.temperature, dim=-1)  # (V,)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = sorted_p.cumsum(-1)
            cut = cum - sorted_p > p.top_p  # keep the smallest prefix whose mass reaches top_p
            sorted_p[cut] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=gen))

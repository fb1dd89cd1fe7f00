"""The embedded tiny chat model: a synthetic corpus, a locally trained
tokenizer, and a few-million-parameter Qwen2 pre-trained on CPU in minutes.

Build it with `clawloop tiny-model` (or `python -m clawloop.tinymodel.build`);
it lands in `~/.cache/clawloop/tiny-chat-v1` (`$CLAWLOOP_CACHE` overrides).
"""

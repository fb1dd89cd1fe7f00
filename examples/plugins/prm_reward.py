"""A process reward model in the OpenClaw-RL README's shape, for `--custom-rm-path`.

    PRM_MODEL_PATH=/models/my-prm clawloop up --custom-rm-path examples/plugins/prm_reward.py

`get_reward_model(config)` is called once when the judge starts;
`config["prm_model_path"]` is PRM_MODEL_PATH (or --judge-model). The object it
returns scores each turn from the user's request, the assistant's reply and
what came next; the score is continuous (here the probability of the
"good" class of a sequence classifier) and is stored and trained on as is.
"""

from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer


class SequenceClassifierPRM:
    def __init__(self, model_path: str):
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=torch.bfloat16)
        self.model.eval()

    def score(self, prompt: str, response: str, next_state: str) -> float:
        text = f"Request: {prompt}\nReply: {response}\nWhat followed: {next_state}"
        inputs = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=2048)
        with torch.no_grad():
            logits = self.model(**inputs).logits  # (1, num_labels)
        return torch.softmax(logits.float(), dim=-1)[0, -1].item()


def get_reward_model(config: dict[str, Any]) -> SequenceClassifierPRM:
    return SequenceClassifierPRM(config["prm_model_path"])

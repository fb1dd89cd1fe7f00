"""A reward function with slime's `--custom-rm-path` signature.

    clawloop up --custom-rm-path examples/plugins/slime_reward.py:reward_func

slime calls `await reward_func(args, sample)`; clawloop does the same with the
judged turn as a sample (`sample.prompt` the request's messages,
`sample.response` the reply, `sample.metadata["next_state"]` what followed).
The value may be a float or slime's `{"score": float}`; fractions are kept.
"""

import re

_PRAISE = re.compile(r"\b(thanks?|thank you|great|perfect|works?)\b", re.I)
_COMPLAINT = re.compile(r"\b(wrong|no|not|error|again)\b", re.I)


async def reward_func(args, sample, **kwargs):
    state = (sample.metadata.get("next_state") or {}).get("content") or ""
    if not isinstance(state, str):
        state = str(state)
    praise, complaint = len(_PRAISE.findall(state)), len(_COMPLAINT.findall(state))
    if praise == complaint:
        return {"score": 0.0}
    # a mixed reply ("thanks, but it's wrong again") gets a fraction, not a full +1 or -1
    return {"score": (praise - complaint) / (praise + complaint)}

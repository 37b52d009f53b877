"""TRL-style reward functions for examples/data/arithmetic.jsonl, as a TRL user writes
them; examples/trl_reward_shim.py serves them to Concord unchanged."""
import re


def _text(completion):
    # conversational rows give [{"role": "assistant", "content": ...}]
    return completion[0]["content"] if isinstance(completion, list) else completion


def correct(prompts, completions, answer, **kwargs):
    """1 when the <answer> tag holds the row's answer."""
    rewards = []
    for c, a in zip(completions, answer):
        m = re.search(r"<answer>\s*(-?\d+)\s*</answer>", _text(c))
        rewards.append(1.0 if m and m.group(1) == str(a).strip() else 0.0)
    return rewards


def brief(prompts, completions, **kwargs):
    """A little for answering in a short tagged line; None (no opinion) for empty text."""
    out = []
    for c in completions:
        t = _text(c).strip()
        if not t:
            out.append(None)
        else:
            out.append(0.2 if re.fullmatch(r"<answer>[^<]*</answer>", t) else 0.0)
    return out

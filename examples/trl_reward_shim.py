#!/usr/bin/env python3
"""Serve TRL-style reward functions to Concord as a reward program.

    [env.options.reward]
    command = ["python3", "examples/trl_reward_shim.py",
               "examples/rewards/arithmetic.py:correct", "examples/rewards/arithmetic.py:brief"]
    components = ["correct", "brief"]   # one per function, logged as rewards/<name>/mean

Each FILE.py:FUNCTION is a function as TRL's GRPOTrainer(reward_funcs=...) takes it,
unchanged: ``def f(prompts, completions, **kwargs) -> list[float | None]``, where
``prompts`` is the rows' ``prompt`` column and ``kwargs`` holds every other column of
the rows, one list entry per completion. As in TRL, a batch whose first row's prompt is
a list of messages is conversational: ``completions[i]`` is
``[{"role": "assistant", "content": TEXT}]``; otherwise it is a string. TRL's
``completion_ids`` and ``trainer_state`` are not passed: Concord sends text only.

The reward of a completion is the sum of the functions' rewards (``None`` counts 0, as
TRL's nansum does); with more than one function each one's is a component named after
the function. Anything the functions print goes to stderr, so it never breaks the
protocol. An exception is printed to stderr and replied as ``{"error": ...}``, which
stops the run with its message.

Protocol: docs/your-own-task.md ("Reward programs"). Standard library only.
"""
import importlib.util
import io
import json
import math
import os
import sys
import traceback


def load(spec):
    path, _, name = spec.rpartition(":")
    if not path or not name:
        sys.exit(f"trl_reward_shim: expected FILE.py:FUNCTION, got {spec!r}")
    module_name = "reward_" + os.path.splitext(os.path.basename(path))[0]
    mod_spec = importlib.util.spec_from_file_location(module_name, path)
    if mod_spec is None:
        sys.exit(f"trl_reward_shim: cannot load {path!r}")
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        sys.exit(f"trl_reward_shim: {path} has no function {name!r}")
    return name, fn


def arguments(batch):
    """TRL's reward-function arguments for a batch of Concord items."""
    prompts, completions = [], []
    keys = sorted({k for item in batch for k in item["row"]} - {"prompt", "completion"})
    columns = {k: [] for k in keys}
    # TRL decides once per batch, from its first row
    first = batch[0]["row"] if batch else {}
    conversational = isinstance(first.get("prompt", first.get("messages")), list)
    for item in batch:
        row = item["row"]
        # the rows' prompt column; without one (`messages`, a custom prompt_key), the
        # messages Concord rendered
        prompt = row.get("prompt")
        if prompt is None:
            prompt = item["prompt"] if conversational else item["prompt"][-1]["content"] if item["prompt"] else ""
        prompts.append(prompt)
        if conversational:
            completions.append([{"role": "assistant", "content": item["completion"]}])
        else:
            completions.append(item["completion"])
        for k in keys:
            columns[k].append(row.get(k))
    return prompts, completions, columns


def number(x):
    if x is None:
        return 0.0
    x = float(x)
    return 0.0 if math.isnan(x) else x


def main():
    specs = sys.argv[1:]
    if not specs:
        sys.exit(__doc__)
    # The protocol owns the real stdout; everything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    funcs = [load(s) for s in specs]
    names = [n for n, _ in funcs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        sys.exit(f"trl_reward_shim: two functions are named {duplicated[0]!r}: their components would clash")
    # Concord writes UTF-8 whatever the locale says
    for line in io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8"):
        try:
            batch = json.loads(line)["batch"]
            prompts, completions, columns = arguments(batch)
            scores = {}
            for name, fn in funcs:
                values = fn(prompts=prompts, completions=completions, **columns)
                if len(values) != len(batch):
                    raise ValueError(f"{name} returned {len(values)} rewards for {len(batch)} completions")
                scores[name] = [number(v) for v in values]
            if len(funcs) == 1:
                rewards = scores[funcs[0][0]]
            else:
                rewards = [
                    {"reward": sum(scores[n][i] for n, _ in funcs),
                     "components": {n: scores[n][i] for n, _ in funcs}}
                    for i in range(len(batch))
                ]
            reply = {"rewards": rewards}
        except Exception as e:  # reported to Concord, which stops the run with it
            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

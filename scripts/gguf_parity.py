#!/usr/bin/env python3
"""GGUF parity: Concord's log-probs on a GGUF file against transformers' own GGUF loader.

Developer tool (needs torch + transformers + gguf + numpy + accelerate from PyPI, CPU; never used by
Concord at runtime or in CI).

    scripts/fetch_real_model.sh
    python3 -m venv .venv && .venv/bin/pip install torch transformers gguf numpy accelerate
    cargo build                      # or --release; the binary is found in the target dir
    .venv/bin/python scripts/gguf_parity.py \
        [--gguf .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf] [--concord PATH] [--tol 1e-3]

Concord side: `concord score --model FILE.gguf` (dequantizes every tensor to f32) prints
the prompt ids (chat template with the generation prompt), the completion ids and
ln p(completion token | prefix). transformers side:
`AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, torch_dtype=float32)` (which
also dequantizes) scores the same ids; its GGUF tokenizer's chat-template ids are compared
with Concord's too. Prints the max |difference| and exits 1 above --tol.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_GGUF = os.path.join(ROOT, ".models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")

MESSAGES = [
    {"role": "system", "content": "You are a careful coordinator. Answer in JSON."},
    {
        "role": "user",
        "content": "Three agents share one ticket queue. Agent A is idle, agent B is "
        "overloaded, agent C is monitoring. Which action should A take next? Reply with "
        '{"action": ..., "reason": ...}.',
    },
]
COMPLETION = (
    '{"action": "TAKE_TICKET", "reason": "B is overloaded and A is idle, so A should '
    'take the oldest ticket from the shared queue."}'
)


def find_concord():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    found = [os.path.join(target, p, "concord") for p in ("release", "debug")]
    found = [p for p in found if os.path.isfile(p)]
    if not found:
        sys.exit(f"no concord binary under {target}; run cargo build or pass --concord")
    return max(found, key=os.path.getmtime)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--concord", default=None, help="concord binary (default: newest build)")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    gguf = os.path.abspath(args.gguf)
    if not os.path.isfile(gguf):
        sys.exit(f"{gguf} is missing: run scripts/fetch_real_model.sh")
    concord = args.concord or find_concord()

    with tempfile.TemporaryDirectory() as tmp:
        mfile = os.path.join(tmp, "messages.json")
        with open(mfile, "w") as f:
            json.dump(MESSAGES, f)
        t0 = time.perf_counter()
        out = subprocess.run(
            [concord, "score", "--model", gguf, "--messages", mfile,
             "--completion", COMPLETION, "--dtype", "f32", "--device", "cpu"],
            check=True, capture_output=True, text=True,
        ).stdout
        t_concord = time.perf_counter() - t0
    res = json.loads(out)
    prompt_ids, completion_ids = res["prompt_ids"], res["completion_ids"]
    lp_concord = np.array(res["logprobs"], dtype=np.float64)

    d, name = os.path.split(gguf)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    # transformers 5 renamed torch_dtype to dtype.
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, **{dtype_kw: torch.float32})
    model.eval()
    t_load = time.perf_counter() - t0
    hf_prompt = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    if isinstance(hf_prompt, dict) or hasattr(hf_prompt, "input_ids"):
        hf_prompt = hf_prompt["input_ids"]
    hf_completion = tok(COMPLETION, add_special_tokens=False)["input_ids"]

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits.float()
    lp = torch.log_softmax(logits[0, :-1], dim=-1)
    targets = ids[0, 1:]
    lp = lp.gather(1, targets[:, None])[:, 0].numpy().astype(np.float64)
    lp_hf = lp[len(prompt_ids) - 1:]

    diff = np.abs(lp_hf - lp_concord)
    report = {
        "gguf": gguf,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(completion_ids),
        "prompt_ids_match_transformers_tokenizer": list(hf_prompt) == prompt_ids,
        "completion_ids_match_transformers_tokenizer": list(hf_completion) == completion_ids,
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "sum_logprob_concord": float(lp_concord.sum()),
        "sum_logprob_transformers": float(lp_hf.sum()),
        "concord_score_s": round(t_concord, 1),
        "transformers_load_s": round(t_load, 1),
        "tol": args.tol,
    }
    print(json.dumps(report, indent=2))
    ok = report["max_abs_diff"] <= args.tol
    print(("PASS" if ok else "FAIL") + f": max |Δ logprob| = {report['max_abs_diff']:.3g} "
          f"(tol {args.tol:g}) over {len(completion_ids)} completion tokens")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

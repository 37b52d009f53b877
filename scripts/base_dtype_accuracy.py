#!/usr/bin/env python3
"""Accuracy of a reduced-precision frozen base (`[model] base_dtype`) on a real model.

Developer tool (standard library only; runs the release binary). For each prompt file
(a JSON list of {"role", "content"} messages) it samples one greedy completion with the
f32 base, then scores exactly those tokens with `concord score` under every
`--base-dtypes` entry and prints the per-token log-prob differences from f32: max |Δ|,
mean |Δ| and the difference of the completion's total log-prob.

    scripts/fetch_real_model.sh
    cargo build --release
    python3 scripts/base_dtype_accuracy.py --model .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --messages prompt0.json prompt1.json --new-tokens 48
"""
import argparse
import json
import subprocess
import sys


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stderr}")
    return res.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concord", default="target/release/concord")
    ap.add_argument("--messages", nargs="+", required=True)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--base-dtypes", nargs="+", default=["bf16", "f16"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    worst = {d: 0.0 for d in args.base_dtypes}
    for path in args.messages:
        gen = json.loads(run([args.concord, "generate", "--model", args.model, "--dtype", "f32",
                              "--messages", path, "--max-new-tokens", str(args.new_tokens),
                              "--temperature", "0", "--json"]))
        text = gen["completions"][0]["text"]
        ref = json.loads(run([args.concord, "score", "--model", args.model, "--dtype", "f32",
                              "--device", "cpu", "--messages", path, "--completion", text]))
        for d in args.base_dtypes:
            got = json.loads(run([args.concord, "score", "--model", args.model, "--dtype", "f32",
                                  "--base-dtype", d, "--device", "cpu", "--messages", path,
                                  "--completion", text]))
            assert got["completion_ids"] == ref["completion_ids"]
            deltas = [abs(a - b) for a, b in zip(got["logprobs"], ref["logprobs"])]
            row = {
                "messages": path,
                "base_dtype": d,
                "tokens": len(deltas),
                "max_abs_delta": max(deltas),
                "mean_abs_delta": sum(deltas) / len(deltas),
                "total_logprob_f32": sum(ref["logprobs"]),
                "total_logprob_delta": sum(got["logprobs"]) - sum(ref["logprobs"]),
            }
            worst[d] = max(worst[d], row["max_abs_delta"])
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{path}  base={d:<4} {row['tokens']} tokens  max |Δ| {row['max_abs_delta']:.4f}  "
                      f"mean |Δ| {row['mean_abs_delta']:.4f}  Δ total {row['total_logprob_delta']:+.4f} "
                      f"(f32 total {row['total_logprob_f32']:.3f})", flush=True)
    summary = {"worst_max_abs_delta": worst}
    print(json.dumps(summary) if args.json else f"worst max |Δ| per base dtype: {worst}")


if __name__ == "__main__":
    main()

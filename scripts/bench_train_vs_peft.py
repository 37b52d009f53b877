#!/usr/bin/env python3
"""LoRA training step: Concord vs Hugging Face transformers + peft, same model, same run.

Developer tool (needs torch + transformers + peft; never used by Concord at runtime or CI).

    concord model init-tiny --out /tmp/q05 --hidden 896 --layers 24 --heads 14 \
        --kv-heads 2 --intermediate 4864
    cargo build --release
    python scripts/bench_train_vs_peft.py --model /tmp/q05 --batch 8 --seq 160

Both sides do the same work: LoRA r16 (alpha 32) on all seven projections, f32 on
CPU, a forward pass over batch x seq random token ids, the sum of next-token
log-probs as the loss, and a backward pass that produces the LoRA gradients. Each
side runs in its own process (one warm-up, then --iters timed iterations) so that
peak RSS is that side's alone. Prints seconds per step, tokens/s, peak RSS, and the
ratios (speed: Concord / HF, memory: Concord / HF).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

HF_CHILD = r"""
import json, resource, sys, time
import torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
model_dir, batch, seq, iters, r, threads = sys.argv[1], *map(int, sys.argv[2:7])
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
cfg = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
model = get_peft_model(model, cfg)
for n, p in model.named_parameters():
    if "lora_B" in n:
        torch.nn.init.constant_(p, 1e-3)  # as Concord's bench: a non-trivial adapter path
model.train()
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, min(model.config.vocab_size, 150_000), (batch, seq), generator=g)
def step():
    logits = model(input_ids=ids).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -lp.sum()
    loss.backward()
    model.zero_grad(set_to_none=True)
step()
t = time.perf_counter()
for _ in range(iters):
    step()
secs = (time.perf_counter() - t) / iters
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": secs, "tokens_per_s": batch * seq / secs, "peak_rss_mb": rss}))
"""


def run_json(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd[:3])} ...\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (e.g. from concord model init-tiny)")
    ap.add_argument("--concord", default="target/release/concord")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=160)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    hf = run_json([sys.executable, "-c", HF_CHILD, args.model, str(args.batch), str(args.seq),
                   str(args.iters), str(args.r), str(args.threads)])
    co = run_json([args.concord, "bench", "train", "--model", args.model, "--batch", str(args.batch),
                   "--seq", str(args.seq), "--iters", str(args.iters), "--r", str(args.r), "--json"])
    row = {
        "batch": args.batch, "seq": args.seq, "r": args.r,
        "hf_seconds": hf["seconds"], "concord_seconds": co["seconds"],
        "hf_tokens_per_s": hf["tokens_per_s"], "concord_tokens_per_s": co["tokens_per_s"],
        "speed_ratio": co["tokens_per_s"] / hf["tokens_per_s"],
        "hf_peak_rss_mb": hf["peak_rss_mb"], "concord_peak_rss_mb": co["peak_rss_mb"],
        "rss_ratio": co["peak_rss_mb"] / hf["peak_rss_mb"],
    }
    if args.json:
        print(json.dumps(row))
    else:
        print(f"batch {args.batch} x seq {args.seq}, LoRA r{args.r}, f32 CPU ({args.threads} threads)")
        print(f"  HF+peft  {hf['seconds']:7.2f} s/step  {hf['tokens_per_s']:7.1f} tok/s  peak RSS {hf['peak_rss_mb']:8.0f} MB")
        print(f"  Concord  {co['seconds']:7.2f} s/step  {co['tokens_per_s']:7.1f} tok/s  peak RSS {co['peak_rss_mb']:8.0f} MB")
        print(f"  speed ratio {row['speed_ratio']:.2f}x   RSS ratio {row['rss_ratio']:.2f}x")


if __name__ == "__main__":
    main()

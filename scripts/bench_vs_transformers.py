#!/usr/bin/env python3
"""Sampling throughput: Concord vs Hugging Face transformers, same model, same run.

Developer tool (needs torch + transformers; never used by Concord at runtime or CI).

    concord model init-tiny --out /tmp/q05 --hidden 896 --layers 24 --heads 14 \
        --kv-heads 2 --intermediate 4864
    cargo build --release
    python scripts/bench_vs_transformers.py --model /tmp/q05 --prompts 1 4 \
        --num-generations 8 --new-tokens 64 --prompt-tokens 100

For each prompt count P it times `model.generate(do_sample=True,
num_return_sequences=G)` on P prompts of T random token ids (f32, CPU), then
`concord bench sample` with the same shapes and sampling parameters, and prints
new tokens per second for both and their ratio. Both force exactly N new tokens
(min_new_tokens = N) so the work is identical.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def hf_bench(model, torch, P, G, N, T, top_k, top_p, temperature, seed, warmup):
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    # stay below the special tokens of Qwen's vocabulary
    ids = torch.randint(0, min(vocab, 151_643), (P, T), generator=g)
    attn = torch.ones_like(ids)
    kw = dict(
        do_sample=True,
        num_return_sequences=G,
        max_new_tokens=N,
        min_new_tokens=N,
        top_k=top_k,
        top_p=top_p,
        temperature=temperature,
        pad_token_id=0,
    )
    with torch.inference_mode():
        if warmup:
            model.generate(input_ids=ids[:, :8], attention_mask=attn[:, :8], **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=attn, **kw)
        dt = time.perf_counter() - t0
    new = out.shape[0] * (out.shape[1] - T)
    return new / dt, dt, new


def concord_bench(binary, model_dir, P, G, N, T, top_k, top_p, temperature, seed):
    cmd = [
        binary, "bench", "sample", "--model", model_dir,
        "--prompts", str(P), "--num-generations", str(G),
        "--new-tokens", str(N), "--prompt-tokens", str(T),
        "--top-k", str(top_k), "--top-p", str(top_p),
        "--temperature", str(temperature), "--seed", str(seed), "--json",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"concord failed: {' '.join(cmd)}\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True,
                    help="model directory (e.g. from concord model init-tiny), or random:qwen2.5-0.5b / random:tiny")
    ap.add_argument("--concord", default="target/release/concord")
    ap.add_argument("--prompts", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--top-k", type=int, default=50, help="transformers' default is 50")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object per row")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = None
    if not args.skip_hf:
        if args.model.startswith("random:"):
            # same shape as Concord's `random:` models (weights differ; timing does not)
            from transformers import Qwen2Config
            shapes = {
                "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2),
                "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                     num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
            }
            cfg = Qwen2Config(**shapes[args.model.split(":", 1)[1]], tie_word_embeddings=True,
                              rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        else:
            model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model.eval()

    G, N, T = args.num_generations, args.new_tokens, args.prompt_tokens
    rows = []
    for P in args.prompts:
        hf_tps = None
        if model is not None:
            hf_tps, hf_s, _ = hf_bench(model, torch, P, G, N, T, args.top_k, args.top_p, args.temperature, args.seed, True)
        c = concord_bench(args.concord, args.model, P, G, N, T, args.top_k, args.top_p, args.temperature, args.seed)
        row = {
            "prompts": P,
            "rows": P * G,
            "new_tokens": N,
            "prompt_tokens": T,
            "hf_tokens_per_s": hf_tps,
            "concord_tokens_per_s": c["tokens_per_s"],
            "concord_prefill_tokens_per_s": c["prefill_tokens_per_s"],
            "concord_peak_rss_mib": c.get("peak_rss_mib"),
            "ratio": (c["tokens_per_s"] / hf_tps) if hf_tps else None,
        }
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            hf = f"{hf_tps:8.1f}" if hf_tps else "     n/a"
            ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "n/a"
            print(
                f"P={P:<3} G={G} rows={P*G:<4} N={N} T={T}  HF {hf} tok/s   "
                f"Concord {c['tokens_per_s']:8.1f} tok/s (prefill {c['prefill_tokens_per_s']:.0f} tok/s)   ratio {ratio}",
                flush=True,
            )


if __name__ == "__main__":
    main()

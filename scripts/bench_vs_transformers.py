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

Concord runs once per `--kernels` path (CONCORD_CPU_KERNELS: avx512, avx2, portable;
`best` leaves it unset) and per `--base-dtypes` entry (the frozen base stored in f32,
bf16 or f16; HF stays f32), all against the one HF measurement of that shape.

`--prefill-tokens 100 700` adds prefill rows: HF's forward (`model(ids)`, with its
cache, as generate's first step) against Concord's prefill (`bench sample` with one
new token and G = 1), P prompts of each length.

The first line printed names the CPU (model name and its SIMD flags).
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


def hf_prefill(model, torch, P, T, seed, reps=1):
    """Timed forward of P x T random ids after one short warm-up, as Concord measures its prefill (best of `reps`)."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(vocab, 151_643), (P, T), generator=g)
    best = None
    with torch.inference_mode():
        model(input_ids=ids[:, :8], use_cache=True)
        for _ in range(reps):
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=True)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
    return P * T / best


def cpu_description():
    """`model name` and the SIMD flags that matter here, from /proc/cpuinfo."""
    name, flags = "unknown CPU", []
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                have = set(line.split(":", 1)[1].split())
                flags = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16") if f in have]
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs, flags: {' '.join(flags) or 'none of avx2/fma/f16c/avx512'}"


def concord_bench(binary, model_dir, P, G, N, T, top_k, top_p, temperature, seed, kernels="best", base_dtype="f32"):
    cmd = [
        binary, "bench", "sample", "--model", model_dir,
        "--prompts", str(P), "--num-generations", str(G),
        "--new-tokens", str(N), "--prompt-tokens", str(T),
        "--top-k", str(top_k), "--top-p", str(top_p),
        "--temperature", str(temperature), "--seed", str(seed), "--json",
    ]
    if base_dtype != "f32":
        cmd += ["--base-dtype", base_dtype]
    env = dict(os.environ)
    env.pop("CONCORD_CPU_KERNELS", None)
    if kernels != "best":
        env["CONCORD_CPU_KERNELS"] = kernels
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
    ap.add_argument("--kernels", nargs="+", default=["best"],
                    help="CONCORD_CPU_KERNELS values to run Concord with (best: unset)")
    ap.add_argument("--base-dtypes", nargs="+", default=["f32"], choices=["f32", "bf16", "f16"],
                    help="Concord's --base-dtype values (HF always runs f32)")
    ap.add_argument("--prefill-tokens", type=int, nargs="*", default=[],
                    help="also compare prefill at these prompt lengths")
    ap.add_argument("--prefill-reps", type=int, default=1,
                    help="prefill rows: best of this many timed runs on each side (a 100-token "
                         "prefill takes under a second, so single runs are noisy)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per row")
    args = ap.parse_args()
    cpu = cpu_description()
    print(json.dumps({"cpu": cpu}) if args.json else f"CPU: {cpu}", flush=True)

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = None
    if not args.skip_hf:
        if args.model.startswith("random:"):
            # same shape as Concord's `random:` models (weights differ; timing does not)
            from transformers import LlamaConfig, Qwen2Config, Qwen3Config
            qwen = dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
            shapes = {
                "tiny": (Qwen2Config, dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, max_position_embeddings=32768, **qwen)),
                "qwen2.5-0.5b": (Qwen2Config, dict(vocab_size=151936, hidden_size=896,
                                                   intermediate_size=4864, num_hidden_layers=24,
                                                   num_attention_heads=14, num_key_value_heads=2,
                                                   max_position_embeddings=32768, **qwen)),
                "qwen3-0.6b": (Qwen3Config, dict(vocab_size=151936, hidden_size=1024,
                                                 intermediate_size=3072, num_hidden_layers=28,
                                                 num_attention_heads=16, num_key_value_heads=8,
                                                 head_dim=128, max_position_embeddings=40960, **qwen)),
                "llama3.2-1b": (LlamaConfig, dict(vocab_size=128256, hidden_size=2048,
                                                  intermediate_size=8192, num_hidden_layers=16,
                                                  num_attention_heads=32, num_key_value_heads=8,
                                                  head_dim=64, max_position_embeddings=131072,
                                                  rope_theta=500_000.0, rms_norm_eps=1e-5,
                                                  tie_word_embeddings=True,
                                                  rope_scaling=dict(rope_type="llama3", factor=32.0,
                                                                    low_freq_factor=1.0,
                                                                    high_freq_factor=4.0,
                                                                    original_max_position_embeddings=8192))),
            }
            config_class, shape = shapes[args.model.split(":", 1)[1]]
            cfg = config_class(**shape)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        else:
            model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model.eval()

    G, N, T = args.num_generations, args.new_tokens, args.prompt_tokens
    variants = [(k, d) for k in args.kernels for d in args.base_dtypes]

    def emit(row, text):
        print(json.dumps(row) if args.json else text, flush=True)

    for P in args.prompts:
        hf_tps = None
        if model is not None:
            hf_tps, hf_s, _ = hf_bench(model, torch, P, G, N, T, args.top_k, args.top_p, args.temperature, args.seed, True)
        for kernels, base in variants:
            c = concord_bench(args.concord, args.model, P, G, N, T, args.top_k, args.top_p,
                              args.temperature, args.seed, kernels, base)
            row = {
                "what": "sample",
                "kernels": kernels,
                "base_dtype": base,
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
            hf = f"{hf_tps:8.1f}" if hf_tps else "     n/a"
            ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "n/a"
            emit(row,
                 f"sample  P={P:<3} G={G} rows={P*G:<4} N={N} T={T}  kernels={kernels:<8} base={base:<4}  "
                 f"HF {hf} tok/s   Concord {c['tokens_per_s']:8.1f} tok/s "
                 f"(prefill {c['prefill_tokens_per_s']:.0f} tok/s)   ratio {ratio}")

    for T2 in args.prefill_tokens:
        for P in args.prompts:
            hf_pf = hf_prefill(model, torch, P, T2, args.seed, args.prefill_reps) if model is not None else None
            for kernels, base in variants:
                pf = max(
                    concord_bench(args.concord, args.model, P, 1, 1, T2, args.top_k, args.top_p,
                                  args.temperature, args.seed, kernels, base)["prefill_tokens_per_s"]
                    for _ in range(max(1, args.prefill_reps))
                )
                row = {
                    "what": "prefill",
                    "kernels": kernels,
                    "base_dtype": base,
                    "prompts": P,
                    "prompt_tokens": T2,
                    "hf_forward_tokens_per_s": hf_pf,
                    "concord_prefill_tokens_per_s": pf,
                    "ratio": (pf / hf_pf) if hf_pf else None,
                    "reps": args.prefill_reps,
                }
                hf = f"{hf_pf:8.1f}" if hf_pf else "     n/a"
                ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "n/a"
                emit(row,
                     f"prefill P={P:<3} T={T2:<5} kernels={kernels:<8} base={base:<4}  "
                     f"HF forward {hf} tok/s   Concord prefill {pf:8.1f} tok/s   ratio {ratio}")


if __name__ == "__main__":
    main()

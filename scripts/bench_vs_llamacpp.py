#!/usr/bin/env python3
"""Decode speed of Concord's quantized base against llama.cpp on the same GGUF file.

Developer tool, never a dependency. llama.cpp is the reference for CPU inference; it
comes from PyPI through llama-cpp-python, built from source for this CPU:

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python==0.3.16

Both sides decode G rows after one shared prompt of L random token ids, N new tokens per
row, on the same threads, in the same run: llama.cpp through its batch API (the prompt
decoded once for all G sequence ids, then one token per sequence per step, greedy), and
`concord bench sample --base-dtype D` for each `--base-dtypes` entry (T = 1, top-k 50:
the choice of tokens costs both little next to the matmuls). Prints one row per side:
decode tokens/s, prefill tokens/s, peak RSS.

    python3 scripts/bench_vs_llamacpp.py --model .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --rows 8 32 --base-dtypes gguf q8_0 q4_k bf16 f32
"""
import argparse
import ctypes
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time


def cpu_line():
    name, flags = platform.processor() or "?", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("?", "x86_64", ""):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    flags = [f for f in ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                                         "avx512_bf16"] if f in have]
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs, flags: {' '.join(flags)}"


def llamacpp(model, rows, prompt_tokens, new_tokens, threads, seed):
    """(prefill s, decode s) of llama.cpp decoding `rows` sequences after one prompt."""
    import llama_cpp as L
    import numpy as np

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    load = getattr(L, "llama_model_load_from_file", None) or L.llama_load_model_from_file
    m = load(model.encode(), mp)
    if not m:
        sys.exit(f"llama.cpp could not load {model}")
    cp = L.llama_context_default_params()
    cp.n_ctx = prompt_tokens + rows * new_tokens + 64
    cp.n_batch = max(prompt_tokens, rows)
    cp.n_ubatch = max(prompt_tokens, rows)
    cp.n_seq_max = rows
    cp.n_threads = threads
    cp.n_threads_batch = threads
    if hasattr(cp, "kv_unified"):
        # One prompt shared by every sequence needs a unified KV cache (llama.cpp's -kvu).
        cp.kv_unified = True
    new_ctx = getattr(L, "llama_init_from_model", None) or L.llama_new_context_with_model
    ctx = new_ctx(m, cp)
    if getattr(L, "llama_model_get_vocab", None):
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
    else:
        n_vocab = L.llama_n_vocab(m)
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 100_000) for _ in range(prompt_tokens)]
    batch = L.llama_batch_init(max(prompt_tokens, rows), 0, rows)

    def fill(items):
        # items: (token, pos, [seq ids], wants logits)
        for i, (tok, pos, seqs, logits) in enumerate(items):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            for j, s in enumerate(seqs):
                batch.seq_id[i][j] = s
            batch.logits[i] = logits
        batch.n_tokens = len(items)

    t0 = time.perf_counter()
    fill([(t, p, list(range(rows)), p == prompt_tokens - 1) for p, t in enumerate(prompt)])
    if L.llama_decode(ctx, batch) != 0:
        sys.exit("llama_decode failed on the prompt")
    prefill = time.perf_counter() - t0

    def argmax(i):
        ptr = L.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    first = argmax(prompt_tokens - 1)
    last = [first] * rows
    t0 = time.perf_counter()
    for step in range(new_tokens - 1):
        fill([(last[r], prompt_tokens + step, [r], True) for r in range(rows)])
        if L.llama_decode(ctx, batch) != 0:
            sys.exit("llama_decode failed while decoding")
        last = [argmax(r) for r in range(rows)]
    decode = time.perf_counter() - t0
    L.llama_batch_free(batch)
    return prefill, decode


def concord(args, rows, base):
    g = args.generations
    cmd = [args.concord, "bench", "sample", "--model", args.model, "--base-dtype", base,
           "--prompts", str(rows // g), "--num-generations", str(g), "--new-tokens",
           str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens), "--json"]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--concord", default="target/release/concord")
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--generations", type=int, default=8, help="rows per prompt on Concord's side")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--base-dtypes", nargs="+", default=["gguf", "q8_0", "q4_k", "bf16", "f32"])
    ap.add_argument("--skip-llamacpp", action="store_true")
    args = ap.parse_args()
    print(cpu_line(), flush=True)
    for rows in args.rows:
        if not args.skip_llamacpp:
            # A child process per row count, so its peak RSS is its own.
            code = ("import json,resource,sys; sys.path.insert(0, %r); import bench_vs_llamacpp as b; "
                    "p, d = b.llamacpp(%r, %d, %d, %d, %d, 0); "
                    "print(json.dumps({'prefill_s': p, 'decode_s': d, "
                    "'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))"
                    % (os.path.dirname(os.path.abspath(__file__)), args.model, rows,
                       args.prompt_tokens, args.new_tokens, args.threads))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"llama.cpp failed:\n{out.stderr}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            decode_tps = rows * (args.new_tokens - 1) / r["decode_s"]
            print(json.dumps({"side": "llama.cpp", "rows": rows, "decode_tokens_per_s": decode_tps,
                              "prefill_tokens_per_s": args.prompt_tokens / r["prefill_s"],
                              "peak_rss_mb": r["rss_mb"]}), flush=True)
        for base in args.base_dtypes:
            r = concord(args, rows, base)
            print(json.dumps({"side": f"concord {base}", "rows": rows,
                              "decode_tokens_per_s": r["decode_tokens_per_s"],
                              "prefill_tokens_per_s": r["prefill_tokens_per_s"],
                              "peak_rss_mb": r["peak_rss_mib"]}), flush=True)


if __name__ == "__main__":
    main()

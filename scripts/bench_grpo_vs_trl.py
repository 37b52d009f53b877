#!/usr/bin/env python3
"""One full GRPO step: Concord vs TRL's GRPOTrainer, same model, same prompts, same run.

Developer tool (needs torch + transformers + peft + trl + gguf; never used by Concord at
runtime or in CI).

    scripts/fetch_real_model.sh
    cargo build --release
    python scripts/bench_grpo_vs_trl.py \
        --model .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --config configs/ticketmelt-qwen2.5-0.5b-cpu.toml

What each side does, in its own process (so each peak RSS is that side's alone):

* Concord: `concord bench grpo-step --json --export-prompts FILE` on the config, with
  dynamic sampling off: one untimed warm-up step, then one timed step of sampling
  (P prompts x G completions, up to L tokens), scoring, the LoRA forward + backward and
  AdamW. The timed step's rendered TICKETMELT prompts are written to FILE.
* TRL: `GRPOTrainer` (transformers generate + peft LoRA, f32 on CPU) on the same GGUF
  (transformers dequantizes it, `from_pretrained(dir, gguf_file=...)`, once: the f32
  checkpoint is kept in `--hf-cache` and loaded from there), with exactly those
  prompt strings as its dataset, the same P, G, L, temperature, top_p, LoRA r / alpha /
  targets, loss type, epsilon, beta and learning rate, and TRL's own defaults otherwise
  (gradient checkpointing on). `bf16=False` because Concord trains in f32 here.
  Its step is timed from `on_step_begin` to `on_step_end` of the one training step.
  The reward is a cheap stand-in (the parsed commitment), because TRL cannot call
  Concord's environment and its update costs the same whatever the reward values are
  (TRL always runs the backward, even for groups that tie; Concord's bench forces the
  update too).

Prints both sides, the speed ratio (TRL seconds / Concord seconds) and both peak RSS
figures, then one JSON line with everything.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

TRL_CHILD = r"""
import json, os, resource, sys, time
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
torch.manual_seed(0)
t_load = time.perf_counter()
cache = a["hf_cache"]
if not os.path.exists(os.path.join(cache, "config.json")):
    # transformers dequantizes the GGUF into plain f32 parameters; keep them as a
    # safetensors checkpoint so later runs load in seconds, and so the trainer sees an
    # ordinary model (it refuses anything still marked as GGUF-quantized).
    d, f = os.path.split(os.path.abspath(a["model"]))
    AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained(cache)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    # Its parameters are plain f32 tensors now; only the GGUF marker remains.
    m.hf_quantizer = None
    m.is_quantized = False
    if hasattr(m.config, "quantization_config"):
        del m.config.quantization_config
    m.save_pretrained(cache)
tok = AutoTokenizer.from_pretrained(cache)
model = AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32)
load_s = time.perf_counter() - t_load
prompts = [json.loads(l)["prompt"] for l in open(a["prompts"])]
ds = Dataset.from_list([{"prompt": p} for p in prompts])

def commitment_reward(completions, **kw):
    out = []
    for c in completions:
        out.append(1.0 if "DEPLOY_PROD_B" in c else 0.5 if "DEPLOY_PROD_A" in c else 0.0)
    return out

class StepTimer(TrainerCallback):
    def __init__(self):
        self.times = []
    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)

cfg = GRPOConfig(
    output_dir=a["out"],
    per_device_train_batch_size=a["prompts_per_step"] * a["num_generations"],
    num_generations=a["num_generations"],
    max_completion_length=a["max_completion_length"],
    temperature=a["temperature"],
    top_p=a["top_p"],
    beta=a["beta"],
    epsilon=a["epsilon"],
    loss_type=a["loss_type"],
    learning_rate=a["learning_rate"],
    max_steps=a["steps"],
    use_cpu=True,
    bf16=False,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    seed=0,
    shuffle_dataset=False,
)
lora = LoraConfig(r=a["r"], lora_alpha=a["alpha"], lora_dropout=0.0, target_modules=a["targets"],
                  task_type="CAUSAL_LM")
timer = StepTimer()
trainer = GRPOTrainer(model=model, reward_funcs=commitment_reward, args=cfg, train_dataset=ds,
                      processing_class=tok, peft_config=lora, callbacks=[timer])
trainer.train()
logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({
    "seconds_per_step": sum(timer.times) / len(timer.times),
    "step_times": timer.times,
    "load_s": load_s,
    "completion_mean_length": logs[-1]["completions/mean_length"] if logs else None,
    "gradient_checkpointing": cfg.gradient_checkpointing,
    "peak_rss_mb": rss,
    "trl": __import__("trl").__version__,
    "torch": torch.__version__,
    "transformers": __import__("transformers").__version__,
    "peft": __import__("peft").__version__,
}))
"""


def last_json(stdout, who):
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"{who} printed no JSON result")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the .gguf file")
    ap.add_argument("--config", default="configs/ticketmelt-qwen2.5-0.5b-cpu.toml")
    ap.add_argument("--concord", default="target/release/concord")
    ap.add_argument("--prompts-per-step", type=int)
    ap.add_argument("--num-generations", type=int)
    ap.add_argument("--max-completion-length", type=int)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Concord override, e.g. optim.gradient_checkpointing=true (repeatable)")
    ap.add_argument("--trl-steps", type=int, default=1, help="TRL steps timed (the mean is reported)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--python", default=sys.executable, help="the Python with trl installed")
    ap.add_argument("--hf-cache", help="where the GGUF's dequantized transformers checkpoint is kept "
                    "(default: next to the GGUF, <name>-hf-f32/)")
    args = ap.parse_args()

    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    g, lo, opt = cfg.get("grpo", {}), cfg.get("lora", {}), cfg.get("optim", {})
    p = args.prompts_per_step or g.get("prompts_per_step", 4)
    n = args.num_generations or g.get("num_generations", 8)
    length = args.max_completion_length or g.get("max_completion_length", 256)
    shared = {
        "prompts_per_step": p,
        "num_generations": n,
        "max_completion_length": length,
        "temperature": g.get("temperature", 1.0),
        "top_p": g.get("top_p", 1.0),
        "beta": g.get("beta", 0.0),
        "epsilon": g.get("epsilon", 0.2),
        "loss_type": g.get("loss_type", "dapo"),
        "learning_rate": opt.get("learning_rate", 1e-6),
        "r": lo.get("r", 8),
        "alpha": lo.get("alpha", 16),
        "targets": lo.get("targets", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    }

    with tempfile.TemporaryDirectory() as tmp:
        prompts = os.path.join(tmp, "prompts.jsonl")
        sets = [
            "grpo.dynamic_sampling=false",
            f"grpo.prompts_per_step={p}",
            f"grpo.num_generations={n}",
            f"grpo.max_completion_length={length}",
        ] + args.set
        cmd = [args.concord, "bench", "grpo-step", "--config", args.config, "--model", args.model,
               "--json", "--export-prompts", prompts]
        for s in sets:
            cmd += ["--set", s]
        print("concord:", " ".join(cmd), file=sys.stderr)
        t = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"concord failed:\n{res.stderr}")
        concord = last_json(res.stdout, "concord")
        concord["wall_s"] = time.perf_counter() - t

        hf_cache = args.hf_cache or os.path.splitext(args.model)[0] + "-hf-f32"
        trl_args = dict(shared, model=args.model, hf_cache=hf_cache, prompts=prompts, out=os.path.join(tmp, "trl"),
                        steps=args.trl_steps, threads=args.threads)
        print(f"trl: GRPOTrainer, {p} x {n} x {length}, LoRA r{shared['r']}", file=sys.stderr)
        t = time.perf_counter()
        res = subprocess.run([args.python, "-c", TRL_CHILD, json.dumps(trl_args)], capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"trl failed:\n{res.stderr[-4000:]}")
        trl = last_json(res.stdout, "trl")
        trl["wall_s"] = time.perf_counter() - t

    ratio = trl["seconds_per_step"] / concord["seconds_per_step"]
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; workload {p} prompts x {n} completions x {length} tokens, "
          f"LoRA r{shared['r']} on {len(shared['targets'])} projections, f32")
    print(f"| side | s/step | peak RSS (MiB) |")
    print(f"|---|---|---|")
    print(f"| Concord (sampling {concord['sampling_s']:.1f} s, update {concord['update_s']:.1f} s) "
          f"| {concord['seconds_per_step']:.1f} | {concord['peak_rss_mb']:.0f} |")
    print(f"| TRL {trl['trl']} GRPOTrainer (gradient checkpointing {trl['gradient_checkpointing']}) "
          f"| {trl['seconds_per_step']:.1f} | {trl['peak_rss_mb']:.0f} |")
    print(f"speed: Concord is {ratio:.2f}x TRL; peak RSS Concord / TRL = "
          f"{concord['peak_rss_mb'] / trl['peak_rss_mb']:.2f}")
    print(json.dumps({"cpu": cpu_name(), "cores": os.cpu_count(), "workload": shared, "concord": concord,
                      "trl": trl, "speedup": ratio}))


if __name__ == "__main__":
    main()

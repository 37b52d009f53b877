#!/usr/bin/env bash
# The one prepared script for a GPU machine (no network there). Carry the CUDA build of
# the binary (scripts/check_cuda_build.sh --build, x86-64: target/gpu/concord.gz) and
# run from the repository root:  scripts/gpu_check.sh [OUT_DIR]
# As a device call: carry target/gpu/concord.gz and run
#   scripts/gpu_check.sh /tmp/gc; cp /tmp/gc/logs.tgz $OUT/
# It prints device info, compares CUDA and CPU log-probs on tiny models, benchmarks
# sampling (tokens chosen on the device and, for comparison, on the host) and LoRA
# training on a Qwen2.5-0.5B-shaped random model (also on a Q4_K base, and a Q8_0 base's
# log-probs against the CPU's) and runs a 5-step training run; every
# step has its own time limit so the whole stays within 8 minutes.
#
# Rehearsal without a GPU (checks every command line):
#   GPU_DEVICE=cpu GPU_DTYPE=f32 GPU_NEW_TOKENS=8 CONCORD_BIN=target/release/concord \
#     scripts/gpu_check.sh /tmp/gpu-rehearsal
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${CONCORD_BIN:-target/gpu/concord}"
OUT="${1:-${OUT:-/tmp/concord-gpu}}"
mkdir -p "$OUT"
DEV="${GPU_DEVICE:-cuda:0}"
DTYPE="${GPU_DTYPE:-bf16}"
TAG="${DEV/:/}"
NEW="${GPU_NEW_TOKENS:-64}"
status=0
step() { # step NAME SECONDS CMD...: the whole output in NAME.log, its end on stdout
  local name=$1 secs=$2; shift 2
  echo "=== $name"
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 4 "$OUT/$name.log" | cut -c1-600
  if [ $rc != 0 ]; then
    echo "!!! $name failed (exit $rc; 124 = timed out)"; status=1
  fi
}

if [ "$DEV" != cpu ]; then
  step device 20 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
fi
if [ ! -x "$BIN" ] && [ -f "$BIN.gz" ]; then
  gunzip -c "$BIN.gz" > "$BIN" && chmod +x "$BIN"
fi
[ -x "$BIN" ] || { echo "no binary at $BIN (or $BIN.gz)"; exit 2; }
if [ "$DEV" != cpu ]; then
  # The binary links CUDA's runtime libraries (cudart, cublas, curand, nvrtc) dynamically:
  # take them from the machine's toolkit or from its Python's nvidia-* wheels.
  for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c \
    'import nvidia, os; print(*[os.path.join(p, "cu13", "lib") for p in nvidia.__path__])' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
  done
  export LD_LIBRARY_PATH
  step ldd 20 ldd "$BIN"
  grep -q "not found" "$OUT/ldd.log" && { echo "!!! libraries missing (see above)"; status=1; }
fi

# Parity: $DEV ($DTYPE and f32) vs CPU f32 log-probs of one completion on tiny models.
echo '[{"role":"user","content":"Deploy to prod A or B?"}]' > "$OUT/msgs.json"
for shape in tied untied; do
  dir="$OUT/tiny-$shape"
  tie=--tie; [ $shape = untied ] && tie=--no-tie
  [ -d "$dir" ] || step "init-$shape" 60 "$BIN" model init-tiny --out "$dir" $tie --seed 7
  for dev in "cpu f32" "$DEV f32" "$DEV $DTYPE"; do
    set -- $dev
    step "score-$shape-${1/:/}-$2" 60 "$BIN" score --model "$dir" --messages "$OUT/msgs.json" \
      --completion '{"commitment": "DEPLOY_PROD_B", "message": "taking B"}' --device "$1" --dtype "$2"
  done
  python3 - "$OUT" "$shape" "$TAG" "$DTYPE" <<'PY' || status=1
import json, sys
out, shape, dev, dtype = sys.argv[1:]
def lp(dev, dt):
    text = open(f"{out}/score-{shape}-{dev}-{dt}.log").read()
    return json.loads(text[text.index("{"):])["logprobs"]
cpu = lp("cpu", "f32")
# f32 within 1e-3; half precision within 0.05 + 1% of the log-prob (bf16 keeps 8 bits)
for dt, abs_tol, rel_tol in (("f32", 1e-3, 0.0), (dtype, 0.05, 0.01)):
    other = lp(dev, dt)
    d = max(abs(a - b) for a, b in zip(cpu, other))
    worst = max(abs(a - b) / (abs_tol + rel_tol * abs(a)) for a, b in zip(cpu, other))
    print(f"{shape}: max |cpu f32 - {dev} {dt}| = {d:.2e} ({worst:.2f} of the tolerance)")
    if worst > 1:
        sys.exit(1)
PY
done

# A quantized base (q8_0): the device's dequantization against the CPU's, same weights.
dir="$OUT/tiny-untied"
for dev in "cpu" "$DEV"; do
  step "score-q8-${dev/:/}" 60 "$BIN" score --model "$dir" --messages "$OUT/msgs.json" \
    --completion '{"commitment": "DEPLOY_PROD_B", "message": "taking B"}' --device "$dev" \
    --dtype f32 --base-dtype q8_0
done
python3 - "$OUT" "$TAG" <<'PY' || status=1
import json, sys
out, dev = sys.argv[1:]
def lp(name):
    text = open(f"{out}/score-q8-{name}.log").read()
    return json.loads(text[text.index("{"):])["logprobs"]
d = max(abs(a - b) for a, b in zip(lp("cpu"), lp(dev)))
print(f"q8_0 base: max |cpu - {dev}| = {d:.2e} (tolerance 1e-3)")
sys.exit(0 if d <= 1e-3 else 1)
PY
step bench-sample-q4k 120 "$BIN" bench sample --model random:qwen2.5-0.5b --device "$DEV" \
  --dtype "$DTYPE" --base-dtype q4_k --prompts 1 --num-generations 8 --new-tokens "$NEW" \
  --prompt-tokens 100 --json
step bench-train-q4k 120 "$BIN" bench train --model random:0.5b --device "$DEV" --dtype "$DTYPE" \
  --base-dtype q4_k --batch 8 --seq 160 --json

# Sampling: tokens chosen on the device (the default off the CPU) and on the host.
for p in 1 4; do
  step "bench-sample-p$p" 120 "$BIN" bench sample --model random:qwen2.5-0.5b --device "$DEV" \
    --dtype "$DTYPE" --prompts $p --num-generations 8 --new-tokens "$NEW" --prompt-tokens 100 --json
done
step bench-sample-p4-host 120 "$BIN" bench sample --model random:qwen2.5-0.5b --device "$DEV" \
  --dtype "$DTYPE" --prompts 4 --num-generations 8 --new-tokens "$NEW" --prompt-tokens 100 \
  --choose-on host --json
step bench-sample-p4-filters 120 "$BIN" bench sample --model random:qwen2.5-0.5b --device "$DEV" \
  --dtype "$DTYPE" --prompts 4 --num-generations 8 --new-tokens "$NEW" --prompt-tokens 100 \
  --top-k 50 --top-p 0.9 --repetition-penalty 1.1 --json
step bench-train 120 "$BIN" bench train --model random:0.5b --device "$DEV" --dtype "$DTYPE" \
  --batch 8 --seq 160 --json
step train-5 120 "$BIN" train --config configs/quickstart.toml --overwrite --set run.steps=5 \
  --set run.output_dir="\"$OUT/runs\"" --set model.device="\"$DEV\"" --set model.dtype="\"$DTYPE\""
(cd "$OUT" && tar czf logs.tgz ./*.log)
echo "=== done (status $status); logs in $OUT and $OUT/logs.tgz"
exit $status

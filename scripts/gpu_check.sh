#!/usr/bin/env bash
# The one prepared script for a GPU machine (no network there). Carry the CUDA build of
# the binary (scripts/check_cuda_build.sh --build, x86-64) as target/cuda/release/concord
# and run from the repository root:  scripts/gpu_check.sh [OUT_DIR]
# It prints device info, compares CUDA and CPU log-probs on tiny models, benchmarks
# sampling and LoRA training on a Qwen2.5-0.5B-shaped random model and runs a 5-step
# training run; every step has its own time limit so the whole stays within 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${CONCORD_BIN:-target/cuda/release/concord}"
OUT="${1:-${OUT:-/tmp/concord-gpu}}"
mkdir -p "$OUT"
DTYPE="${GPU_DTYPE:-bf16}"
status=0
step() { # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "=== $name"
  if ! timeout "$secs" "$@" 2>&1 | tee "$OUT/$name.log"; then
    echo "!!! $name failed or timed out"; status=1
  fi
}

step device 20 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
[ -x "$BIN" ] || { echo "no CUDA binary at $BIN"; exit 2; }

# Parity: CUDA ($DTYPE and f32) vs CPU f32 log-probs of one completion on tiny models.
for shape in tied untied; do
  dir="$OUT/tiny-$shape"
  tie=--tie; [ $shape = untied ] && tie=--no-tie
  step "init-$shape" 60 "$BIN" model init-tiny --out "$dir" $tie --seed 7
  echo '[{"role":"user","content":"Deploy to prod A or B?"}]' > "$OUT/msgs.json"
  for dev in "cpu f32" "cuda:0 f32" "cuda:0 $DTYPE"; do
    set -- $dev
    step "score-$shape-${1/:/}-$2" 60 "$BIN" score --model "$dir" --messages "$OUT/msgs.json" \
      --completion '{"commitment": "DEPLOY_PROD_B", "message": "taking B"}' --device "$1" --dtype "$2"
  done
  python3 - "$OUT" "$shape" "$DTYPE" <<'PY' || status=1
import json, sys
out, shape, dtype = sys.argv[1:]
def lp(dev, dt):
    text = open(f"{out}/score-{shape}-{dev}-{dt}.log").read()
    return json.loads(text[text.index("{"):])["logprobs"]
cpu = lp("cpu", "f32")
for dev, dt, tol in (("cuda0", "f32", 1e-3), ("cuda0", dtype, 0.1)):
    d = max(abs(a - b) for a, b in zip(cpu, lp(dev, dt)))
    print(f"{shape}: max |cpu f32 - {dev} {dt}| = {d:.2e} (tolerance {tol})")
    if d > tol:
        sys.exit(1)
PY
done

step bench-sample-p1 120 "$BIN" bench sample --model random:qwen2.5-0.5b --device cuda:0 --dtype "$DTYPE" \
  --prompts 1 --num-generations 8 --new-tokens 64 --prompt-tokens 100 --json
step bench-sample-p4 120 "$BIN" bench sample --model random:qwen2.5-0.5b --device cuda:0 --dtype "$DTYPE" \
  --prompts 4 --num-generations 8 --new-tokens 64 --prompt-tokens 100 --json
step bench-train 120 "$BIN" bench train --model random:0.5b --device cuda:0 --dtype "$DTYPE" \
  --batch 8 --seq 160 --json
step train-5 120 "$BIN" train --config configs/quickstart.toml --set run.steps=5 \
  --set run.output_dir="\"$OUT/runs\"" --set model.device=cuda:0 --set model.dtype="$DTYPE"
echo "=== done (status $status); logs in $OUT"
exit $status

#!/usr/bin/env bash
# Data-parallel scaling on this machine: the same GRPO steps in one process on one core
# (taskset), in one process on two cores and in `mpirun -np 2` (one core each), one run
# after the other; prints the CPU, the mean step time of each (the first step left out:
# it pays the one-off allocations) and the 2-process run's time in collectives
# (`concord train` reports it at the end). The runs sample the same completions (a
# data-parallel run does not depend on the number of processes), so their steps compare
# one to one.
#
# Usage: scripts/bench_data_parallel.sh CONFIG [STEPS] [extra --set arguments...]
#   e.g. scripts/bench_data_parallel.sh configs/ticketmelt-qwen2.5-0.5b-cpu.toml 4 \
#          --set sft.warm_start=false --set model.adapter=docs/runs/ticketmelt-0.5b
# Needs a `--features mpi` build (built here into target/release) and mpirun. With 2
# processes on a 2-core machine mpirun binds each to one core (its default for np <= 2),
# so both runs use the same cores.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="$1"; STEPS="${2:-4}"; shift; shift || true
OUT="${OUT_DIR:-/tmp/concord-dp-bench}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
grep -m1 'model name' /proc/cpuinfo
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512_bf16)$' | tr '\n' ' ')"
echo "cores: $(nproc)"
cargo build --release --features mpi --bin concord 2>&1 | tail -1
BIN=target/release/concord
common=(--set run.output_dir="$OUT" --set run.steps="$STEPS" --set run.save_every=0 --overwrite "$@")
echo "== 1 process, 1 core"
taskset -c 0 "$BIN" train --config "$CONFIG" --set run.name=one-core "${common[@]}" 2>&1 | grep -aE "^done" || true
echo "== 1 process, 2 cores"
"$BIN" train --config "$CONFIG" --set run.name=one "${common[@]}" 2>&1 | grep -aE "^done" || true
echo "== mpirun -np 2"
mpirun -np 2 "$BIN" train --config "$CONFIG" --set run.name=two "${common[@]}" 2>&1 \
  | grep -aE "^(done|data parallel|  )" || true
python3 - "$OUT" <<'EOF'
import csv, sys
out = sys.argv[1]
def mean_step(name):
    rows = list(csv.DictReader(open(f"{out}/{name}/training_log.csv")))
    t = [float(r["step_time"]) for r in rows[1:]] or [float(rows[0]["step_time"])]
    return sum(t) / len(t), len(t)
(c, n), (a, _), (b, _) = mean_step("one-core"), mean_step("one"), mean_step("two")
print(f"mean step time over {n} steps: 1 process on 1 core {c:.2f} s, on 2 cores {a:.2f} s; "
      f"2 processes {b:.2f} s: {c / b:.2f}x the 1-core process, {a / b:.2f}x the 2-core one")
EOF

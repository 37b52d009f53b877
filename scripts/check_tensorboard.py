#!/usr/bin/env python3
"""Check a run's TensorBoard events with TensorBoard's own reader.

Developer tool (needs `pip install tensorboard`; never a CI dependency). For each run
directory given (and its warm start's `sft/`, when present) it loads
`RUN_DIR/tensorboard/` with `tensorboard.backend.event_processing.EventAccumulator`
(which checks every record's CRCs) and compares every scalar with the CSV cell it came
from: `train/<column>` with training_log.csv, `eval/<env>/<column>` with eval_log.csv,
at the row's step, to float32 precision. Exits non-zero on any difference, on a step
logged twice, or on a numeric cell with no scalar.

    cargo run --release -- train --config configs/quickstart.toml \
        --set 'run.report_to=["csv", "tensorboard"]' --set run.eval_every=10
    python3 scripts/check_tensorboard.py runs/quickstart
"""
import csv
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator

NOT_SCALARS = {"step", "stage", "env"}


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def expected(run_dir):
    """(tag, step) -> value for every numeric cell of the run's CSV logs."""
    want = {}
    for name, prefix in (("training_log.csv", lambda r: "train"),
                         ("eval_log.csv", lambda r: f"eval/{r['env']}")):
        path = os.path.join(run_dir, name)
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                step = int(row["step"])
                for col, cell in row.items():
                    if col in NOT_SCALARS:
                        continue
                    try:
                        x = float(cell)
                    except ValueError:
                        continue
                    key = (f"{prefix(row)}/{col}", step)
                    if key in want:
                        sys.exit(f"{path}: step {step} logged twice")
                    want[key] = f32(x)
    return want


def check(run_dir):
    acc = event_accumulator.EventAccumulator(
        os.path.join(run_dir, "tensorboard"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            if (tag, ev.step) in got:
                sys.exit(f"{run_dir}: {tag} at step {ev.step} twice")
            got[(tag, ev.step)] = ev.value
    want = expected(run_dir)
    bad = [k for k in want if k not in got]
    bad += [k for k in got if k not in want]
    bad += [k for k in want if k in got and not (
        got[k] == want[k] or (math.isnan(got[k]) and math.isnan(want[k])))]
    if bad:
        sys.exit(f"{run_dir}: {len(bad)} scalars differ from the CSV, e.g. {sorted(bad)[:5]}")
    steps = sorted({s for _, s in got})
    print(f"{run_dir}: {len(got)} scalars, {len(acc.Tags()['scalars'])} tags, "
          f"steps {steps[0]}..{steps[-1]}: all equal to the CSV cells")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for run_dir in sys.argv[1:]:
        check(run_dir)
        if os.path.isdir(os.path.join(run_dir, "sft", "tensorboard")):
            check(os.path.join(run_dir, "sft"))


if __name__ == "__main__":
    main()

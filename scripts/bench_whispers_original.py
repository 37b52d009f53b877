#!/usr/bin/env python3
"""Episodes/s of the original Whispers environment (seed 004) with the `wait` policy and
its scripted seats, tasks t1..t6 round-robin, per second of process CPU time: the
reference for `concord envs bench whispers`.

    python3 scripts/bench_whispers_original.py PATH/TO/ORIGINAL [SECONDS]

PATH is a checkout of the original repository (the directory holding `whispers/`);
it needs pydantic. `httpx` (used only by its HTTP client) is stubbed if missing.
"""
import logging
import sys
import time
import types

if len(sys.argv) < 2:
    sys.exit(__doc__)
sys.path.insert(0, sys.argv[1])
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
try:
    import httpx  # noqa: F401
except ImportError:
    stub = types.ModuleType("httpx")
    stub.Client = stub.Response = stub.Timeout = object
    stub.HTTPError = Exception
    sys.modules["httpx"] = stub
logging.disable(logging.CRITICAL)

from whispers.env import WhispersEnv  # noqa: E402
from whispers.models import WhispersAction  # noqa: E402

tasks = ["t1", "t2", "t3", "t4", "t5", "t6"]
wait = WhispersAction(tool="wait")
n = 0
t0, w0 = time.process_time(), time.time()
while time.process_time() - t0 < secs:
    env = WhispersEnv(task_id=tasks[n % 6], seed=n)
    env.reset()
    done = False
    while not done:
        _, _, done, _ = env.step(wait)
    env.grade_terminal()
    n += 1
cpu, wall = time.process_time() - t0, time.time() - w0
print(f'{{"episodes": {n}, "episodes_per_s": {n / cpu:.1f}, "wall_episodes_per_s": {n / wall:.1f}}}')

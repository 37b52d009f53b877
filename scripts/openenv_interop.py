#!/usr/bin/env python3
"""Interop check of Concord with the real Python OpenEnv stack (openenv-core), both ways.

1. Python client -> Concord server: start `concord serve ticketmelt`, drive it with
   openenv-core's own `GenericEnvClient` (reset with a seed, play an episode), and
   compare the per-step rewards, the final reward and the actions recorded in the
   server's state with `concord envs play` on the same seed and policy.
2. Concord client -> Python server: start a minimal openenv-core environment server
   (written below with `create_app`, served by uvicorn) and train 2 GRPO steps against
   it with `concord train` (`[env] url`, the built-in tiny model), in episode mode and
   in decision mode.

Needs a venv with `pip install openenv-core==0.3.0` or `pip install openenv==0.10.0`
(the package's current name; both are verified); not part of CI (CI has no Python).
Usage:

    python scripts/openenv_interop.py [--concord target/debug/concord] [--seeds 0 7 42]

Exits non-zero on the first mismatch.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from importlib.metadata import PackageNotFoundError, version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, what, timeout=60.0):
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if json.load(r).get("status") == "healthy":
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{what} did not become healthy on port {port}")


def play_in_process(concord, seed, policy):
    """(texts of seat 0 per step, final scalar) from `concord envs play --json`."""
    out = subprocess.run(
        [concord, "envs", "play", "ticketmelt", "--seed", str(seed), "--policy", policy, "--json"],
        check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout
    lines = out.splitlines()
    scalar = None
    for line in lines:
        if line.startswith("seat 0: scalar "):
            scalar = float(line.split()[3])
    start = next(i for i, l in enumerate(lines) if l.startswith("{"))
    transcript = json.loads("\n".join(lines[start:]))
    return [step[0] for step in transcript["steps"]], scalar, transcript


def python_client_to_concord_server(concord, seeds):
    from openenv.core.generic_client import GenericEnvClient

    port = free_port()
    server = subprocess.Popen(
        [concord, "serve", "ticketmelt", "--port", str(port), "--max-sessions", "8"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(port, server, "concord serve")
        for seed in seeds:
            for policy in ["always_b", "random", "heuristic"]:
                texts, scalar, transcript = play_in_process(concord, seed, policy)
                with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as env:
                    r = env.reset(seed=seed, episode_id=f"interop-{seed}")
                    assert r.reward is None and not r.done, r
                    assert r.observation["messages"][0]["role"] == "system"
                    rewards = []
                    for text in texts:
                        assert not r.done
                        r = env.step({"message": text})
                        rewards.append(r.reward)
                    assert r.done, "the episode should end where the in-process one did"
                    final = r.observation["rewards"][0]
                    state = env.state()
                # the terminal step reward is the episode scalar (TICKETMELT's step rewards)
                assert abs(sum(rewards) - final["scalar"]) < 1e-9, (rewards, final)
                assert abs(final["scalar"] - scalar) < 5e-4, (final, scalar)  # printed to 3 places
                assert state["episode_id"] == f"interop-{seed}"
                assert state["step_count"] == len(texts)
                assert state["transcript"]["steps"] == transcript["steps"]
                print(f"  seed {seed:>3} {policy:<9}: {len(texts)} steps, rewards {rewards}, "
                      f"scalar {final['scalar']:.3f} == envs play {scalar:.3f}")
        # a malformed action is refused with VALIDATION_ERROR, and the session goes on
        with GenericEnvClient(base_url=f"ws://127.0.0.1:{port}").sync() as env:
            env.reset(seed=1)
            try:
                env.step({"text": "wrong field"})
                sys.exit("a malformed action was accepted")
            except RuntimeError as e:
                assert "VALIDATION_ERROR" in str(e), e
            r = env.step({"message": "MONITOR"})
            assert r.observation["step"] == 1
        print("  malformed action: VALIDATION_ERROR, session still usable")
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert server.returncode == 0, f"concord serve exited with {server.returncode} on SIGTERM"
    print("  SIGTERM: concord serve exited cleanly")


# A minimal openenv-core environment: say "yes" three times. Observation and reward
# types are openenv-core's; served by its own create_app.
PY_ENV = textwrap.dedent('''
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class SayAction(Action):
        message: str

    class SayObservation(Observation):
        prompt: str = ""
        last: str = ""

    class SayYes(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True
        STEPS = 3

        def __init__(self):
            super().__init__()
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, **kw):
            self._state = State(episode_id=episode_id, step_count=0)
            return SayObservation(prompt=f"Round 1 of {self.STEPS}: say yes.", reward=None)

        def step(self, action, **kw):
            self._state.step_count += 1
            n = self._state.step_count
            # 1 for a yes; else 0.01 per character (at most 0.5), so the random tiny
            # model earns a reward that shows the per-step rewards arrive
            text = action.message.lower()
            reward = 1.0 if "yes" in text else min(len(text), 50) / 100
            return SayObservation(prompt=f"Round {n + 1} of {self.STEPS}: say yes.",
                                  last=action.message, reward=reward, done=n >= self.STEPS)

        @property
        def state(self):
            return self._state

    app = create_app(SayYes, SayAction, SayObservation, env_name="say_yes", max_concurrent_envs=16)
''')


def concord_client_to_python_server(concord):
    import csv

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "say_yes_app.py"), "w") as f:
            f.write(PY_ENV)
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "say_yes_app:app", "--port", str(port), "--log-level", "warning"],
            cwd=tmp,
        )
        try:
            wait_healthy(port, server, "the openenv-core server")
            cfg = os.path.join(tmp, "remote.toml")
            with open(cfg, "w") as f:
                f.write(textwrap.dedent(f'''
                    [run]
                    name = "interop"
                    output_dir = "{tmp}"
                    seed = 1
                    steps = 2
                    save_every = 0
                    [model]
                    name = "{tmp}/tiny"
                    init_tiny = true
                    dtype = "f32"
                    device = "cpu"
                    [lora]
                    r = 4
                    alpha = 8
                    targets = ["q_proj", "v_proj"]
                    [grpo]
                    num_generations = 4
                    prompts_per_step = 2
                    max_completion_length = 1024
                    temperature = 1.0
                    [env]
                    url = "ws://127.0.0.1:{port}"
                    mode = "episode"
                    observation_key = "prompt"
                    max_turn_tokens = 12
                '''))
            def train(*sets):
                subprocess.run([concord, "train", "--config", cfg, *sets], check=True, cwd=ROOT)
                with open(os.path.join(tmp, "interop", "training_log.csv")) as f:
                    rows = list(csv.DictReader(f))
                assert len(rows) == 2, rows
                return rows

            rows = train()
            print("  episode mode:")
            for r in rows:
                turns = float(r["episode/mean_turns"])
                reward = float(r["rewards/remote_reward/mean"])
                assert turns >= 1.0, r
                assert 0.0 < reward <= 3.0, r  # the remote step rewards arrived
                print(f"  step {r['step']}: reward {float(r['reward']):.3f}, "
                      f"remote_reward {reward:.3f}, mean turns {turns:.2f}")
            # Decision mode: the model plays to each decision and on from each answer;
            # every answer's copy replays the episode's actions in a new session.
            rows = train("--overwrite", "--set", "env.mode=decision",
                         "--set", "env.continue_with=model", "--set", "env.max_turn_tokens=0",
                         "--set", "grpo.max_completion_length=12")
            print("  decision mode (continue_with = \"model\"):")
            for r in rows:
                reward = float(r["rewards/remote_reward/mean"])
                assert 0.0 < reward <= 3.0, r  # the remote step rewards arrived
                print(f"  step {r['step']}: reward {float(r['reward']):.3f}, "
                      f"remote_reward {reward:.3f}")
        finally:
            server.terminate()
            server.wait(timeout=30)


def openenv_version():
    """`openenv X` (0.4 on) or `openenv-core X` (up to 0.3), whichever is installed."""
    for dist in ("openenv", "openenv-core"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    sys.exit("neither openenv nor openenv-core is installed in this Python")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concord", default=os.path.join(ROOT, "target", "release", "concord"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 7, 42])
    a = ap.parse_args()
    if not os.path.exists(a.concord):
        sys.exit(f"{a.concord} not found: build it (cargo build --release) or pass --concord")
    print(openenv_version())
    print("1. OpenEnv GenericEnvClient -> concord serve ticketmelt")
    python_client_to_concord_server(a.concord, a.seeds)
    print("2. concord train -> OpenEnv server (create_app + uvicorn)")
    concord_client_to_python_server(a.concord)
    print("interop: OK (both directions)")


if __name__ == "__main__":
    main()

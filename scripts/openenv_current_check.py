#!/usr/bin/env python3
"""`concord serve` against the current OpenEnv release (openenv 0.10): its validator and
its MCP tool client, for every built-in environment.

For each environment it starts `concord serve ENV` on a free port and
1. runs `openenv validate --url http://127.0.0.1:PORT --json` (openenv's runtime
   criteria: /openapi.json with info.version, /health, /metadata, /schema, /mcp, and the
   mode the OpenAPI paths declare) and requires `passed`;
2. plays one whole episode with `MCPToolClient` (`openenv/session/create`, reset over
   the WebSocket it attaches with `?session_id=`, `tools/list`, `tools/call act` until
   the step's `data` says done, `state`, `openenv/session/close`), and checks that the
   same seed and answers played over `GenericEnvClient`'s WebSocket end with the same
   rewards.

The answer to every turn is the same fixed text (which each environment parses to an
action or to its documented default), so the episode runs to its end whatever the
environment. Needs a venv with `pip install openenv==0.10.0` (not part of CI):

    cargo build --release
    python3 scripts/openenv_current_check.py [--concord target/release/concord]

Exits non-zero on the first failure.
"""
import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from openenv_interop import free_port, wait_healthy  # noqa: E402
ENVS = {
    "ticketmelt": '{"commitment": "MONITOR"}',
    "merge_ring": '{"action": "yield"}',
    "whispers": '{"tool": "wait"}',
    "postmortem": '{"tool": "submit"}',
}


def validate(port):
    exe = shutil.which("openenv", path=os.path.dirname(sys.executable)) or "openenv"
    out = subprocess.run([exe, "validate", "--url", f"http://127.0.0.1:{port}", "--json"],
                         capture_output=True, text=True)
    report = json.loads(out.stdout)
    crit = report.get("criteria", [])
    passed = [c["id"] for c in crit if c.get("passed")]
    failed = [f"{c['id']}: {c.get('message', '')}" for c in crit if not c.get("passed")]
    if not report.get("passed") or out.returncode != 0:
        sys.exit(f"openenv validate failed (exit {out.returncode}): {failed}\n{out.stdout}")
    return report, passed


async def play_mcp(port, seed, answer):
    from openenv.core.mcp_client import MCPToolClient

    async with MCPToolClient(base_url=f"http://127.0.0.1:{port}") as env:
        await env.reset(seed=seed)
        tools = [t.name for t in await env.list_tools()]
        assert tools == ["act", "observe", "rules"], tools
        rewards, done, calls = [], False, 0
        while not done:
            data = await env.call_tool("act", message=answer)
            rewards.append(data["reward"])
            done = data["done"]
            calls += 1
        final = data["observation"]["rewards"]
        state = await env.state()
        steps = state.step_count if hasattr(state, "step_count") else state["step_count"]
        assert steps == calls, (steps, calls)
        try:
            await env.call_tool("act", message=answer)
            sys.exit("acting after the end was accepted")
        except RuntimeError as e:
            assert "Error calling tool 'act'" in str(e), e
    return rewards, final, tools


def play_ws(port, seed, answer, steps):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=f"ws://127.0.0.1:{port}").sync() as env:
        r = env.reset(seed=seed)
        rewards = []
        for _ in range(steps):
            r = env.step({"message": answer})
            rewards.append(r.reward)
        assert r.done
        return rewards, r.observation["rewards"]


def check(concord, name, answer, seed):
    port = free_port()
    server = subprocess.Popen([concord, "serve", name, "--port", str(port)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, server, "concord serve")
        report, passed = validate(port)
        rewards, final, tools = asyncio.run(play_mcp(port, seed, answer))
        ws_rewards, ws_final = play_ws(port, seed, answer, len(rewards))
        assert ws_rewards == rewards and ws_final == final, (rewards, ws_rewards)
        print(f"  {name}: validate passed {len(passed)}/{len(report['criteria'])} "
              f"({report.get('standard_profile')}, {', '.join(passed)}); MCPToolClient "
              f"seed {seed}: {len(rewards)} tool calls, final reward "
              f"{final[0]['scalar']:.3f} == GenericEnvClient's")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concord", default=os.path.join(ROOT, "target", "release", "concord"))
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(a.concord):
        sys.exit(f"{a.concord} not found: build it (cargo build --release) or pass --concord")
    print(f"openenv {version('openenv')}")
    for name, answer in ENVS.items():
        check(a.concord, name, answer, a.seed)
    print("openenv current: OK")


if __name__ == "__main__":
    main()

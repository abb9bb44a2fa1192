"""A real two-node Ray cluster on this machine: `ray start --head` + `ray start --address`.

Each node gets one CPU, so the scenario's two DeviceActors (`num_cpus: 1` each) must land on
different nodes. The scenario runs in a driver process through `ray.init(address=...)` (the
`tools/placement.py` scenario script), and both nodes are stopped by terminating
the two `ray start --block` processes this test started (never `ray stop`, which would stop
every Ray on the machine).

Token authentication: both nodes and the driver get `RAY_AUTH_MODE=token` and a fresh
`RAY_AUTH_TOKEN`, so the test neither needs nor touches `~/.ray/auth_token`. Every address
passed here is 127.0.0.1; on Linux Ray's CLI still advertises each node under the machine's
own IP (it resolves loopback addresses), which never leaves the machine either.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import REPO

RAY = str(Path(sys.executable).with_name("ray"))
NODE = ["--num-cpus=1", "--num-gpus=0", f"--memory={1536 * 2**20}",
        f"--object-store-memory={96 * 2**20}", "--disable-usage-stats", "--block"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_ports() -> list[str]:
    """Explicit free ports for everything a node listens on, so this cluster collides with no
    other Ray on the machine (defaults such as 52365 or 10001 are fixed numbers)."""
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-grpc-port",
             "dashboard-agent-listen-port", "metrics-export-port", "runtime-env-agent-port"]
    return [f"--{n}={free_port()}" for n in names]


def start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    # own session: if `ray start` fails to clean up, its process group is ours to kill
    return subprocess.Popen([RAY, "start", *args], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(log: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "block forever" in log.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"ray start exited with {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.5)
    raise AssertionError(f"ray start did not come up in {timeout}s:\n{log.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
@pytest.mark.cluster
def test_two_node_cluster_runs_a_scenario_on_both_nodes(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_USAGE_STATS_ENABLED": "0", "RAYMM_NO_PROGRESS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="rmm", dir="/tmp")  # short: unix socket paths are limited
    head = start_node(["--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                       f"--ray-client-server-port={free_port()}", "--include-dashboard=false",
                       f"--temp-dir={temp}", *node_ports(), *NODE], env, tmp_path / "head.log")
    worker = None
    try:
        wait_for(tmp_path / "head.log", head)
        worker = start_node([f"--address={address}", *node_ports(), *NODE], env,
                            tmp_path / "worker.log")
        wait_for(tmp_path / "worker.log", worker)
        driver = subprocess.run(
            [sys.executable, str(REPO / "tools" / "placement.py"),
             str(REPO / "scenarios" / "quickstart.yaml"), "--set", "rounds=2",
             "--set", "eval.every=2", "--set", f"execution.address={address}",
             "--set", "execution.actor={num_cpus: 1, max_restarts: 0}",
             "--set", "execution.training.path=lockstep"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        line = next((x for x in driver.stdout.splitlines() if x.startswith("PLACEMENT ")), None)
        assert driver.returncode == 0 and line, driver.stdout[-3000:] + driver.stderr[-3000:]
        out = json.loads(line[len("PLACEMENT "):])
    finally:
        for proc in (worker, head):
            if proc is not None:
                stop(proc)
        shutil.rmtree(temp, ignore_errors=True)
    assert out["nodes"] == 2 and sorted(out["actors_per_node"].values()) == [1, 1]
    assert sum(a["devices"] for a in out["actors"]) == 40          # quickstart's population
    assert out["rounds"] == 2 and 0.0 < out["final_accuracy"] <= 1.0
    assert head.returncode is not None and worker is not None and worker.returncode is not None

"""`raymm sweep --address` on a real two-node Ray cluster on this machine (the loopback cluster
of test_multinode.py: `ray start --head` + `ray start --address`, one CPU each, token auth,
every address 127.0.0.1).

A 2 x 2 grid over the quickstart: each run's driver is a Ray actor in a placement group with
its one DeviceActor, so the two nodes hold two runs at once and the runs land on both. The
sweep is killed (SIGKILL) while runs are in flight and started again: it skips what finished,
continues the rest from the checkpoints that came back, and every run ends with the numbers of
the same sweep run locally one run at a time (CPU: bit-identical). The cluster is stopped by
terminating the `ray start --block` processes this test started.

`python tests/integration/test_cluster_sweep.py` runs it outside pytest and prints the figures,
with two more sweeps for the wall time (docs/cluster.md): a clean one on the two nodes and one
on a one-node cluster. The test leaves those out: a time is a benchmark's figure, not a test's
assertion, and they were half of its four minutes in the suite.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from raymm.driver import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import REPO, load_script  # noqa: E402

MULTINODE = load_script(REPO / "tests" / "integration" / "test_multinode.py",
                        "multinode_cluster_helpers")
GRID = ["--grid", "training.lr=0.01,0.05", "--grid", "selection.k=5,10"]
# rounds enough that a run outlasts a few of the sweep's file pulls (every 5 s), so the kill can
# land while a run is under way on any machine
SETS = ["rounds=100", "eval.every=50", "output.checkpoint_every=1", "output.tensorboard=true",
        "execution.actor={num_cpus: 1, max_restarts: 0}"]
NAMES = [f"quickstart_lr{lr}_k{k}-seed0" for lr in ("0.01", "0.05") for k in (5, 10)]


def cluster_env() -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_USAGE_STATS_ENABLED": "0", "RAYMM_NO_PROGRESS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    return env


@contextmanager
def loopback_cluster(nodes: int, logs: Path, env: dict[str, str], extra: list[str] = ()):
    """A head and nodes - 1 more, one CPU each; yields (address, [ray start processes])."""
    port = MULTINODE.free_port()
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="rmc", dir="/tmp")   # short: unix socket paths are limited
    procs = [MULTINODE.start_node(
        ["--head", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--ray-client-server-port={MULTINODE.free_port()}", "--include-dashboard=false",
         f"--temp-dir={temp}", *MULTINODE.node_ports(), *MULTINODE.NODE, *extra], env,
        logs / "head.log")]
    try:
        MULTINODE.wait_for(logs / "head.log", procs[0])
        for i in range(1, nodes):
            procs.append(MULTINODE.start_node(
                [f"--address={address}", *MULTINODE.node_ports(), *MULTINODE.NODE, *extra],
                env, logs / f"node{i}.log"))
            MULTINODE.wait_for(logs / f"node{i}.log", procs[-1])
        yield address, procs
    finally:
        for proc in reversed(procs):
            MULTINODE.stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


def sweep_cmd(out: Path, address: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "raymm.app.cli", "sweep", str(REPO / "scenarios" /
           "quickstart.yaml"), *GRID, "--seeds", "0", "--out", str(out)]
    for s in SETS:
        cmd += ["--set", s]
    return cmd + (["--address", address] if address else [])


def nodes_of(out: Path) -> dict[str, str]:
    """run -> the node id it (last) ran on, from the sweep's log lines."""
    where = {}
    for name in NAMES:
        lines = [x for x in (out / "runs" / f"{name}.log").read_text().splitlines()
                 if " on node " in x]
        where[name] = lines[-1].split(" on node ")[1].split()[1]
    return where


def in_flight(out: Path) -> list[str]:
    """Runs that have brought a whole checkpoint back and have no summary yet (the hidden
    `.part` file of a checkpoint still being pulled is not one: a sweep killed then restarts
    that run)."""
    runs = out / "runs"
    return [n for n in NAMES if checkpoint.candidates(runs / n)
            and not (runs / n / "summary.json").exists()] if runs.exists() else []


def rounds(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def run_figures(tmp: Path, timed: bool = False) -> dict:
    """The sweeps' figures; `timed`: also the clean two-node and the one-node sweeps' wall
    times (their runs are checked against the serial reference too)."""
    env = cluster_env()
    figures: dict = {}
    # the reference: the same sweep on the serial executor, one run at a time in one process
    local = subprocess.run([*sweep_cmd(tmp / "local", None), "--executor", "serial"], env=env,
                           capture_output=True, text=True, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:]

    (tmp / "two").mkdir()
    with loopback_cluster(2, tmp / "two", env) as (address, _):
        out = tmp / "two" / "sw"
        t0 = time.monotonic()
        first = subprocess.Popen(sweep_cmd(out, address), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        # kill the sweep as soon as a run has brought a checkpoint back but not finished
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and first.poll() is None:
            if in_flight(out):
                break
            time.sleep(0.2)
        figures["in_flight_at_kill"] = len(in_flight(out))
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        said_first = first.communicate()[0]
        figures["killed_after_s"] = round(time.monotonic() - t0, 1)
        figures["finished_before_kill"] = sum((out / "runs" / n / "summary.json").exists()
                                              for n in NAMES)
        again = subprocess.run(sweep_cmd(out, address), env=env, capture_output=True,
                               text=True, timeout=1200)
        figures["two_nodes_total_s"] = round(time.monotonic() - t0, 1)
        assert again.returncode == 0, said_first[-2000:] + again.stdout[-3000:] + \
            again.stderr[-3000:]
        figures["skipped"] = again.stdout.count("skipping ")
        figures["resumed"] = again.stdout.count("resuming ")
        figures["restarted"] = again.stdout.count("restarting ")
        figures["runs_per_node"] = dict(Counter(nodes_of(out).values()))
        if not timed:
            return _checked(figures, tmp, [out])
        # a clean sweep on the same two nodes, for the wall time
        t0 = time.monotonic()
        clean = subprocess.run(sweep_cmd(tmp / "two" / "clean", address), env=env,
                               capture_output=True, text=True, timeout=1200)
        figures["two_nodes_s"] = round(time.monotonic() - t0, 1)
        assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
        figures["clean_runs_per_node"] = dict(Counter(nodes_of(tmp / "two" / "clean").values()))
    (tmp / "one").mkdir()
    with loopback_cluster(1, tmp / "one", env) as (address, _):
        t0 = time.monotonic()
        single = subprocess.run(sweep_cmd(tmp / "one" / "sw", address), env=env,
                                capture_output=True, text=True, timeout=1200)
        figures["one_node_s"] = round(time.monotonic() - t0, 1)
        assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    return _checked(figures, tmp, [out, tmp / "two" / "clean", tmp / "one" / "sw"])


def _checked(figures: dict, tmp: Path, sweeps: list[Path]) -> dict:
    """`figures`, once every run of `sweeps` equals the serial reference's bit for bit and has
    all its files."""
    for name in NAMES:
        for where in sweeps:
            run = where / "runs" / name
            pd.testing.assert_frame_equal(rounds(run), rounds(tmp / "local" / "runs" / name),
                                          check_exact=True)
            for f in ("config.yaml", "summary.json", "model.safetensors"):
                assert (run / f).is_file(), run / f
            assert list(run.glob("**/events.out.tfevents.*")), run
    return figures


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(3600)
def test_a_grid_sweep_spreads_over_two_nodes_and_survives_being_killed(tmp_path):
    figures = run_figures(tmp_path)
    print("FIGURES " + json.dumps(figures))
    assert len(figures["runs_per_node"]) == 2
    # the restarted sweep skips what finished and continues the rest (a run not started yet
    # starts quietly), and one seen mid-run resumes from the checkpoint it had brought back;
    # how far the runs got before the kill depends on the machine's load
    assert figures["skipped"] == figures["finished_before_kill"] < 4
    assert figures["resumed"] + figures["restarted"] <= 4 - figures["finished_before_kill"]
    assert figures["in_flight_at_kill"] >= 1 and figures["resumed"] >= 1, figures


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="r31-cluster-") as d:
        print("FIGURES " + json.dumps(run_figures(Path(d), timed=True)), flush=True)

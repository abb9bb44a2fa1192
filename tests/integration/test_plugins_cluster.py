"""The example plugin (examples/mylab) on a real two-node Ray cluster on this machine, where no
node can import it: run by a driver that has it on its own sys.path, and by `ray job submit`.
Both must give the serial run's numbers bit for bit.

The cluster is the loopback one of test_multinode.py (its helpers are reused): a head with the
dashboard (the job server) and a second node, one CPU each, token authentication, every address
127.0.0.1. The scenario's two DeviceActors take one CPU each, so one runs on each node. The
plugin's package sits in a temporary folder that neither node's Python path holds (checked by a
task on each node), nor the driver's working directory (which Ray adds to the workers' path).
Both nodes are stopped by terminating the `ray start --block` processes this test started.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file

from helpers import REPO, load_script

MULTINODE = load_script(REPO / "tests" / "integration" / "test_multinode.py",
                        "multinode_cluster_helpers")
RAY = MULTINODE.RAY
SETS = ["rounds=4", "eval.every=2", "execution.devices_per_actor=6",
        "execution.actor={num_cpus: 1, max_restarts: 0}"]

DRIVER = """
import importlib.util, json, sys
sys.path.insert(0, {plugin!r})   # the plugin: on this process's path only
import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray.util.state import list_actors
import raymm

ray.init(address={address!r}, logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def importable():
    return importlib.util.find_spec("mylab") is not None

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
found = ray.get([importable.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
    n, soft=False)).remote() for n in nodes])
sets = {sets!r}
on_ray = raymm.run({scenario!r}, [*sets, "execution.executor=ray"], out={runs!r},
                   plugins=["mylab.fl"])
actor_nodes = sorted(a.node_id for a in list_actors(
    address={dashboard!r}, filters=[("class_name", "=", "DeviceActor")], limit=100))
ray.shutdown()
serial = raymm.run({scenario!r}, [*sets, "execution.executor=serial"], out={runs!r})
same = all(np.array_equal(on_ray.params[g], serial.params[g]) for g in serial.params)
print("RESULT " + json.dumps({{"nodes": len(nodes), "importable": found,
                              "actor_nodes": actor_nodes, "same_params": same,
                              "ray_dir": str(on_ray.run_dir), "serial_dir": str(serial.run_dir)}}))
"""

#: run as the job's first step: not even a job whose driver has the plugin on its PYTHONPATH
#: gives it to its workers
JOB_CHECK = """
import importlib.util
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init()
assert importlib.util.find_spec("mylab") is not None  # the job's driver has it

@ray.remote(num_cpus=0)
def importable():
    return importlib.util.find_spec("mylab") is not None

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
found = ray.get([importable.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
    n, soft=False)).remote() for n in nodes])
assert found == [False, False], found
print("JOB_CHECK ok")
"""


def rounds(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(1200)
def test_plugin_reaches_nodes_that_lack_it_and_runs_under_job_submit(tmp_path):
    plugin = tmp_path / "plugin"
    shutil.copytree(REPO / "examples" / "mylab" / "mylab", plugin / "mylab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    scenario = REPO / "examples" / "mylab" / "scenario.yaml"
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_USAGE_STATS_ENABLED": "0", "RAYMM_NO_PROGRESS": "1", "RAYMM_NO_ENTRY_POINTS": "1",
           "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    port, dashboard = MULTINODE.free_port(), MULTINODE.free_port()
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="rmp", dir="/tmp")  # short: unix socket paths are limited
    head = MULTINODE.start_node(
        ["--head", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--ray-client-server-port={MULTINODE.free_port()}", "--include-dashboard=true",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", f"--temp-dir={temp}",
         *MULTINODE.node_ports(), *MULTINODE.NODE], env, tmp_path / "head.log")
    worker = None
    try:
        MULTINODE.wait_for(tmp_path / "head.log", head)
        worker = MULTINODE.start_node([f"--address={address}", *MULTINODE.node_ports(),
                                       *MULTINODE.NODE], env, tmp_path / "worker.log")
        MULTINODE.wait_for(tmp_path / "worker.log", worker)

        # a driver with the plugin on its own sys.path
        (tmp_path / "driver").mkdir()
        script = tmp_path / "driver" / "drive.py"
        script.write_text(DRIVER.format(plugin=str(plugin), address=address, sets=SETS,
                                        scenario=str(scenario),
                                        dashboard=f"http://127.0.0.1:{dashboard}",
                                        runs=str(tmp_path / "driver" / "runs")))
        done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path / "driver",
                              capture_output=True, text=True, timeout=600)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        assert done.returncode == 0 and line, done.stdout[-3000:] + done.stderr[-5000:]
        out = json.loads(line[len("RESULT "):])

        # the same run as a job: the plugin is on the job driver's PYTHONPATH only
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        shutil.copy(scenario, job_dir / "scenario.yaml")
        (job_dir / "check.py").write_text(JOB_CHECK)
        sets = [f"--set '{s}'" for s in SETS]
        driver_env = f"env PYTHONPATH={REPO}{os.pathsep}{plugin} {sys.executable}"
        jobs = []
        for entrypoint in (f"{driver_env} check.py",
                           f"{driver_env} -m raymm.app.cli run scenario.yaml --plugin mylab.fl "
                           f"{' '.join(sets)} --executor ray --out {tmp_path / 'job-runs'}"):
            job = subprocess.run(
                [str(RAY), "job", "submit", "--address", f"http://127.0.0.1:{dashboard}",
                 "--working-dir", str(job_dir), "--", "sh", "-c", entrypoint],
                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
            assert job.returncode == 0 and "succeeded" in job.stdout.lower(), \
                job.stdout[-5000:] + job.stderr[-3000:]
            jobs.append(job.stdout)
        assert "JOB_CHECK ok" in jobs[0]
    finally:
        for proc in (worker, head):
            if proc is not None:
                MULTINODE.stop(proc)
        shutil.rmtree(temp, ignore_errors=True)

    assert out["nodes"] == 2 and out["importable"] == [False, False]
    assert len(set(out["actor_nodes"])) == 2  # one DeviceActor on each node
    assert out["same_params"]
    serial_dir = Path(out["serial_dir"])
    pd.testing.assert_frame_equal(rounds(Path(out["ray_dir"])), rounds(serial_dir),
                                  check_exact=True)
    (job_run,) = (tmp_path / "job-runs").iterdir()
    pd.testing.assert_frame_equal(rounds(job_run), rounds(serial_dir), check_exact=True)
    assert (job_run / "plugins.json").is_file()
    job_model, serial_model = (load_file(d / "model.safetensors") for d in (job_run, serial_dir))
    assert job_model.keys() == serial_model.keys()
    assert all(np.array_equal(job_model[k], serial_model[k]) for k in job_model)

"""An embedded Ray listens on loopback only, and a normal run prints raymm's lines only."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from helpers import REPO, tiny_scenario

SCRIPT = """
import json, os, sys
from raymm.api import run
from netlisten import descendants, is_loopback, listening
seen = []
def hook(row):
    seen.extend(listening(descendants(os.getpid())))
res = run(json.loads(sys.argv[1]), out=sys.argv[2], on_round=hook)
print(json.dumps({"sockets": seen, "rounds": res.summary["rounds_completed"]}))
"""


def env():
    return {**os.environ, "RAYMM_NO_PROGRESS": "1", "RAYMM_VERBOSE": "",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}


def ray_scenario(**kw):
    return tiny_scenario(**{"rounds": 2, "execution.executor": "ray",
                            "execution.devices_per_actor": 6, "execution.local_num_cpus": 2,
                            **kw})


@pytest.mark.slow
def test_embedded_ray_listens_on_loopback_only(tmp_path):
    from netlisten import is_loopback

    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(ray_scenario()),
                           str(tmp_path)], env=env(), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rounds"] == 2
    addresses = {a for _, a in out["sockets"]}
    assert len(addresses) >= 3, addresses  # GCS, raylet, workers: the check saw them
    assert all(is_loopback(a) for a in addresses), addresses


def test_loopback_addresses():
    from netlisten import is_loopback

    assert is_loopback("127.0.0.1:80") and not is_loopback("0.0.0.0:80")
    assert not is_loopback("192.0.2.2:80")
    assert is_loopback("[00000000:00000000:0000ffff:7f000001]:5")
    assert not is_loopback("[00000000:00000000:00000000:00000000]:5")  # [::], every interface


@pytest.mark.slow
def test_a_normal_ray_run_prints_only_raymm_lines(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(ray_scenario()))
    proc = subprocess.run([sys.executable, "-m", "raymm.cli", "run", str(path), "--out",
                           str(tmp_path / "runs")], env=env(), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("tiny: 2 rounds, final accuracy")
    assert lines[1].startswith("run directory: ")
    assert proc.stderr == ""
    run_dir = next((tmp_path / "runs").iterdir())
    modes = {p.name: p.stat().st_mode & 0o777 for p in run_dir.iterdir() if p.is_file()}
    assert set(modes.values()) == {0o644}, modes  # under the usual umask of 022


@pytest.mark.slow
def test_faults_are_one_line_per_round_on_stderr(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(ray_scenario(rounds=4, faults={
        "actor_kill_prob": 0.5, "device_crash_prob": 0.2})))
    proc = subprocess.run([sys.executable, "-m", "raymm.cli", "run", str(path), "--out",
                           str(tmp_path / "runs")], env=env(), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2, proc.stdout
    err = proc.stderr.splitlines()
    assert err and all(line.startswith("raymm: round ") for line in err), proc.stderr
    assert len({line.split(":")[1] for line in err}) == len(err)  # one line per round
    assert any("device host(s) died" in line for line in err)

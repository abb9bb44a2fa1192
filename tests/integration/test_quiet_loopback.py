"""An embedded Ray listens on loopback only, a run prints raymm's lines only (results on
stdout, one line per round with faults on stderr), and its files are 0644. One Ray start."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from helpers import REPO, tiny_scenario

# `raymm run` as a user types it; each round (through the fault-line hook, called every round)
# also records the sockets the run's process tree listens on
SCRIPT = """
import json, os, sys
import raymm.driver.progress as progress
from raymm.app.cli import main
from netlisten import descendants, listening
seen, say = [], progress.say_faults
def spy(row, bar):
    seen.extend(listening(descendants(os.getpid())))
    say(row, bar)
progress.say_faults = spy
rc = main(["run", sys.argv[1], "--out", sys.argv[2]])
with open(sys.argv[3], "w") as f:
    json.dump(seen, f)
sys.exit(rc)
"""


def test_loopback_addresses():
    from netlisten import is_loopback

    assert is_loopback("127.0.0.1:80") and not is_loopback("0.0.0.0:80")
    assert not is_loopback("192.0.2.2:80")
    assert is_loopback("[00000000:00000000:0000ffff:7f000001]:5")
    assert not is_loopback("[00000000:00000000:00000000:00000000]:5")  # [::], every interface
    assert is_loopback("[00000000:00000000:00000000:00000001]:5")  # ::1


def test_listening_reads_this_process_sockets():
    import os
    import socket

    from netlisten import is_loopback, listening

    socks = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"),
                         (socket.AF_INET, "0.0.0.0")):
        s = socket.socket(family)
        try:
            s.bind((host, 0))
        except OSError:  # no IPv6 here
            s.close()
            continue
        s.listen()
        socks.append((s, host != "0.0.0.0"))
    try:
        seen = dict((a.rsplit(":", 1)[1], a) for _, a in listening({os.getpid()}))
        for s, loop in socks:
            assert is_loopback(seen[str(s.getsockname()[1])]) == loop
    finally:
        for s, _ in socks:
            s.close()


@pytest.mark.slow
def test_ray_run_is_quiet_on_loopback_and_reports_faults_per_round(tmp_path):
    from netlisten import is_loopback

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{
        "rounds": 4, "execution.executor": "ray", "execution.devices_per_actor": 6,
        "execution.local_num_cpus": 2, "output.tensorboard": True,
        "faults": {"actor_kill_prob": 0.5, "device_crash_prob": 0.2}})))
    env = {**os.environ, "RAYMM_NO_PROGRESS": "1", "RAYMM_VERBOSE": "",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path), str(tmp_path / "runs"),
                           str(tmp_path / "sockets.json")], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert len(out) == 2 and out[0].startswith("tiny: 4 rounds, final accuracy"), proc.stdout
    assert out[1].startswith("run directory: ")
    err = proc.stderr.splitlines()  # nothing from Ray: only raymm's fault lines
    assert err and all(line.startswith("raymm: round ") for line in err), proc.stderr
    assert len({line.split(":")[1] for line in err}) == len(err)  # one line per round
    assert any("device host(s) died" in line for line in err)
    addresses = {a for _, a in json.loads((tmp_path / "sockets.json").read_text())}
    assert len(addresses) >= 3, addresses  # GCS, raylet, workers: the check saw them
    assert all(is_loopback(a) for a in addresses), addresses
    run_dir = next((tmp_path / "runs").iterdir())
    modes = {p.name: p.stat().st_mode & 0o777 for p in run_dir.iterdir() if p.is_file()}
    assert set(modes.values()) == {0o644}, modes  # under the usual umask of 022

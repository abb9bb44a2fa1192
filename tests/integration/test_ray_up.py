"""`ray up cluster-local.yaml`, `ray job submit`, `ray down`: the path docs/cluster.md promises,
run for real against an sshd of the test's own on 127.0.0.1 (the head is this machine).

The shipped cluster-local.yaml is used as it is, except for what a loopback head must change:
the addresses (head 127.0.0.1, no workers), `auth` (the test's key, and `nc` as the proxy
command because the local provider has no port field), a unique cluster name, and extra flags on
the head's `ray start` (loopback addresses, small resources, and a custom resource `rayup_head`
that the scenario's DeviceActors ask for, so the run can only succeed on this cluster). Its
file_mounts, rsync_exclude and setup_commands run unchanged. The node is "already provisioned":
the test puts ~/raymm-venv in the session's HOME beforehand, a virtualenv that sees this
interpreter's packages (a .pth file) and has a `ray` script, so the pinned `pip install`s find
everything satisfied instead of downloading torch; `pip install -e .` still installs raymm from
the rsynced checkout into it.

HAZARD: `ray up` and `ray down` run `ray stop` on the head, which here is this machine: it stops
every Ray on it. So the test is marked `alone` (tests/conftest.py orders it last), shuts down this
session's own Ray, and waits (RAYMM_RAY_UP_WAIT_S, default 600 s) until no raylet runs here,
then fails clearly if one still does. Keys, sshd config, both HOMEs and Ray's state files live
in private folders of the test, removed at the end.
"""

from __future__ import annotations

import copy
import getpass
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from helpers import REPO
from loopback_sshd import Sshd, private_dir, start_sshd
from needs import loopback_tools

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(1500)]

RAY = Path(sys.executable).with_name("ray")
WAIT_S = float(os.environ.get("RAYMM_RAY_UP_WAIT_S", "600"))
HEAD_FLAGS = ("--node-ip-address=127.0.0.1 --dashboard-host=127.0.0.1 --num-cpus=2 --num-gpus=0"
              f" --memory={2 * 2**30} --object-store-memory={200 * 2**20}"
              " --resources='{\"rayup_head\": 2}' --disable-usage-stats")


def raylets(containing: str = "") -> list[str]:
    """Command lines of every raylet running on this machine (any user's) whose command line
    contains `containing`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            line = b" ".join(argv).decode(errors="replace")
            if Path(argv[0].decode(errors="replace")).name == "raylet" and containing in line:
                found.append(f"{entry.name}: {line[:200]}")
    return found


def wait_until_no_raylet(timeout: float) -> None:
    """`ray up`/`ray down` would stop them: wait for other Ray users to finish, or fail."""
    import ray

    if ray.is_initialized():  # this session's shared local Ray (conftest.ray_session)
        ray.shutdown()
    deadline = time.monotonic() + timeout
    while running := raylets():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"Ray is running on this machine after waiting {timeout:.0f}s; `ray up`/`ray "
                f"down` would stop it (they run `ray stop` here). Run this test alone:\n"
                + "\n".join(running))
        time.sleep(min(30.0, timeout / 20 + 1))


def loopback_config(shipped: dict, name: str, sshd: Sshd) -> dict:
    """The shipped on-prem config with a head on 127.0.0.1 reached through the test's sshd."""
    cfg = copy.deepcopy(shipped)
    cfg["cluster_name"] = name
    cfg["provider"].update(head_ip="127.0.0.1", worker_ips=[])
    cfg["min_workers"] = cfg["max_workers"] = 0
    cfg["auth"] = {"ssh_user": sshd.user, "ssh_private_key": str(sshd.key),
                   "ssh_proxy_command": f"nc %h {sshd.port}"}
    head = cfg["head_start_ray_commands"]
    (i,) = [j for j, c in enumerate(head) if "ray start --head" in c]
    head[i] = f"{head[i]} {HEAD_FLAGS}"
    return cfg


def provision_venv(home: Path) -> None:
    """~/raymm-venv as on a node that setup_commands already ran on once: this interpreter's
    packages (torch, ray, ...) through a .pth file, and the `ray` console script."""
    venv = home / "raymm-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (pth,) = venv.glob("lib/python*/site-packages")
    dirs = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (pth / "zz_raymm_test_base.pth").write_text(
        f"import site; list(map(site.addsitedir, {dirs!r}))\n")
    script = venv / "bin" / "ray"
    script.write_text(f"#!{venv}/bin/python\nimport sys\nfrom ray.scripts.scripts import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    # or setup_commands would quietly install the whole pinned stack (~7 GB, minutes)
    subprocess.run([str(venv / "bin" / "python"), "-c", "import ray, torch, sklearn"],
                   check=True, env={"PATH": "/usr/bin:/bin"})


def ray_cli(args: list[str], env: dict[str, str], log: Path, timeout: float) -> str:
    """Run `ray ARGS` from the repository root; its output goes to `log` and is returned."""
    done = subprocess.run([str(RAY), *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    log.write_text(done.stdout)
    assert done.returncode == 0, f"ray {args[0]} failed ({done.returncode}):\n" + \
        done.stdout[-6000:]
    return done.stdout


def stop_ssh_masters(control_dir: Path) -> None:
    """Ray's ssh ControlMaster processes for this cluster (they outlive a command by 10 s)."""
    if control_dir.is_dir():
        for sock in control_dir.iterdir():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                           capture_output=True, timeout=10)
        shutil.rmtree(control_dir, ignore_errors=True)
    try:
        control_dir.parent.rmdir()  # only when empty: no other cluster of this user uses it
    except OSError:
        pass


def test_ray_up_job_submit_ray_down_on_loopback():
    loopback_tools()  # sshd, ssh, rsync, nc: skipped without them, required in CI
    phases: dict[str, float] = {}
    t = time.monotonic()
    wait_until_no_raylet(WAIT_S)
    phases["wait_for_no_ray"] = time.monotonic() - t

    root = private_dir("rayup-")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rmu", dir="/tmp"))  # short: socket paths
    name = f"raymm-rayup-test-{os.getpid()}"
    control_dir = Path("/tmp") / (
        "ray_ssh_" + hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]) / \
        hashlib.sha256(name.encode()).hexdigest()[:10]
    sshd = None
    upped = False
    try:
        t = time.monotonic()
        sshd = start_sshd(root, getpass.getuser())
        (sshd.home / ".bashrc").write_text(f"export RAY_TMPDIR={ray_tmp}\n")
        provision_venv(sshd.home)
        phases["sshd_and_node"] = time.monotonic() - t

        client_home, client_tmp, out = root / "client", root / "client-tmp", root / "runs"
        for d in (client_home, client_tmp, out):
            d.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("RAY_") and k not in ("PYTHONPATH", "TMPDIR")}
        env.update(HOME=str(client_home), TMPDIR=str(client_tmp), RAY_TMPDIR=str(client_tmp),
                   AUTOSCALER_NODE_START_WAIT_S="120", RAY_USAGE_STATS_ENABLED="0",
                   RAY_AUTH_MODE="token",
                   RAY_AUTH_TOKEN_PATH=str(client_home / ".ray" / "auth_token"),
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        # the documented first step; RAY_AUTH_TOKEN_PATH would make it read, not generate
        ray_cli(["get-auth-token", "--generate"],
                {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN_PATH"},
                root / "token.log", 60)
        (client_home / ".ray" / "auth_token").chmod(0o600)
        config = root / "cluster-loopback.yaml"
        config.write_text(yaml.safe_dump(loopback_config(
            yaml.safe_load((REPO / "cluster-local.yaml").read_text()), name, sshd)))

        t = time.monotonic()
        upped = True
        ray_cli(["up", "-y", "--no-config-cache", str(config)], env, root / "up.log", 600)
        phases["ray_up"] = time.monotonic() - t
        head_token = sshd.home / ".ray" / "auth_token"
        assert head_token.read_text() == (client_home / ".ray" / "auth_token").read_text()
        assert head_token.stat().st_mode & 0o777 == 0o600
        assert (sshd.home / "raymm" / "raymm" / "app" / "cli.py").is_file()  # rsynced checkout
        assert not (sshd.home / "raymm" / ".git").exists()            # rsync_exclude
        imported = subprocess.run(  # setup's `pip install -e .` put the rsynced copy first
            [str(sshd.home / "raymm-venv" / "bin" / "python"), "-c",
             "import raymm; print(raymm.__file__)"], capture_output=True, text=True,
            env={"PATH": "/usr/bin:/bin"}, cwd=root)
        assert imported.stdout.strip() == str(sshd.home / "raymm" / "raymm" / "__init__.py"), \
            imported.stdout + imported.stderr

        t = time.monotonic()
        job = ray_cli(
            ["job", "submit", "--address", "http://127.0.0.1:8265", "--working-dir", ".", "--",
             "raymm", "run", "scenarios/quickstart.yaml", "--set", "rounds=3",
             "--set", "eval.every=3",
             "--set", "execution.actor={num_cpus: 1, resources: {rayup_head: 1}, "
                      "max_restarts: 0}",
             "--out", str(out)], env, root / "job.log", 600)
        phases["job_submit"] = time.monotonic() - t
        assert "succeeded" in job.lower(), job[-3000:]
        (run_dir,) = out.glob("quickstart-*")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["rounds_completed"] == 3 and summary["devices"] == 40
        assert 0.0 < summary["final_accuracy"] <= 1.0
        rounds = pd.read_parquet(run_dir / "rounds.parquet")
        assert rounds["round"].tolist() == [1, 2, 3]
        assert (rounds["selected"] == 10).all() and (rounds["bytes_up"] > 0).all()
        config_run = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config_run["execution"]["actor"]["resources"] == {"rayup_head": 1}

        t = time.monotonic()
        upped = False
        ray_cli(["down", "-y", str(config)], env, root / "down.log", 300)
        phases["ray_down"] = time.monotonic() - t
        deadline = time.monotonic() + 60  # the head's raylet: its sockets are in ray_tmp
        while raylets(str(ray_tmp)) and time.monotonic() < deadline:
            time.sleep(1)
        assert raylets(str(ray_tmp)) == [], "ray down left the head's raylet running"
        state = json.loads((client_tmp / "ray" / f"cluster-{name}.state").read_text())
        assert [n["state"] for n in state.values()] == ["terminated"]
    finally:
        if upped:  # a failure after `ray up` started: the head may be running
            subprocess.run([str(RAY), "down", "-y", str(root / "cluster-loopback.yaml")],
                           cwd=REPO, env=env, capture_output=True, timeout=300)
        if sshd is not None:
            sshd.stop()
        stop_ssh_masters(control_dir)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print("RAY_UP_PHASES " + json.dumps({k: round(v, 1) for k, v in phases.items()}))

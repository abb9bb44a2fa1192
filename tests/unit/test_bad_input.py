"""Bad input never escapes as a traceback: one clear message, exit code 2, nothing written."""

import copy
import json
import os
import zipfile

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raymm.app.cli import main

from helpers import REPO, tiny_scenario

OUTCOMES: dict[str, int] = {"examples": 0, "exit0": 0, "exit2": 0}


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5000), st.floats(-2, 2),
    st.sampled_from([float("nan"), float("inf"), -1e9, 0, 1, 1.5, "auto", "", "random",
                     "fedavg", "always", "custom", "a", "zzz", [], {}, [1, 2], {"x": 1}]),
    st.text(max_size=8))


@st.composite
def mutated(draw):
    raw = tiny_scenario(**{"rounds": 1, "output.tensorboard": False})
    for _ in range(draw(st.integers(1, 3))):
        all_paths = [p for p in paths(raw) if p]
        path = draw(st.sampled_from(all_paths))
        parent = raw
        for p in path[:-1]:
            parent = parent[p]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "k", "name", "sensors", "alpha"]))] = \
                copy.deepcopy(draw(VALUES))
        else:
            # a copy: the sampled lists and dicts are shared objects, and putting one inside
            # itself (a later edit below it) made a cycle, and changed VALUES for later examples
            parent[path[-1]] = copy.deepcopy(draw(VALUES))
        if not isinstance(raw, dict):
            break
    return raw


def run_cli(argv, capsys):
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    return rc, captured.err


@settings(max_examples=300, deadline=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=mutated())
def test_mutated_scenarios_never_escape(raw, tmp_path, capsys):
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(raw))
    OUTCOMES["examples"] += 1
    out = tmp_path / f"runs-{OUTCOMES['examples']}"  # tmp_path is shared by all examples
    rc, err = run_cli(["validate", str(p)], capsys)
    assert rc in (0, 2)
    if rc == 2:
        OUTCOMES["exit2"] += 1
        assert err.startswith("raymm: ") and err.count("raymm:") == 1
        return
    OUTCOMES["exit0"] += 1
    # bounded work: a mutation may have asked for thousands of rounds or epochs
    rc, err = run_cli(["run", str(p), "--executor", "serial", "--out", str(out),
                       "--no-progress", "--set", "rounds=1", "--set", "training.local_epochs=1"],
                      capsys)
    assert rc in (0, 2), err
    if rc == 2 and "training diverged" not in err:
        # a run that diverged (e.g. a large lr) stops with exit 2 and keeps its run directory
        assert not out.exists() or not any(out.iterdir())


def test_report_outcomes(capsys):
    """Not an assertion of behaviour: prints the tally of the property test above."""
    with capsys.disabled():
        print(f"\nmutated scenarios: {json.dumps(OUTCOMES)}")
    if OUTCOMES["examples"]:
        assert OUTCOMES["exit0"] + OUTCOMES["exit2"] == OUTCOMES["examples"]


@pytest.mark.parametrize("text", ["name: [unclosed", "- just\n- a list\n", "\x00\x01binary",
                                  "42", "", "name: x\nrounds: -3\n", "rounds: 1\n"])
def test_not_a_scenario(tmp_path, capsys, text):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    rc, err = run_cli(["validate", str(p)], capsys)
    assert rc == 2 and err.startswith("raymm: ")


def _har_npz(path, n=20, acc_shape=(128, 3)):
    rng = np.random.default_rng(0)
    arrays = {}
    for split in ("train", "test"):
        arrays[f"{split}_acc"] = rng.normal(size=(n, *acc_shape)).astype(np.float32)
        arrays[f"{split}_gyro"] = rng.normal(size=(n, 128, 3)).astype(np.float32)
        arrays[f"{split}_y"] = np.arange(n) % 6
        arrays[f"{split}_subject"] = np.arange(n) % 3 + 1
    np.savez_compressed(path, **arrays)


@pytest.mark.parametrize("damage", ["truncated", "wrong_shape", "not_zip", "missing_key"])
def test_corrupt_data_files_exit_2_and_write_nothing(tmp_path, capsys, monkeypatch, damage):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    f = tmp_path / "har.npz"
    if damage == "wrong_shape":
        _har_npz(f, acc_shape=(64, 3))
    else:
        _har_npz(f)
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif damage == "not_zip":
        f.write_bytes(b"this is not an npz file")
    elif damage == "missing_key":
        with zipfile.ZipFile(f) as z:
            keep = {n: z.read(n) for n in z.namelist() if not n.startswith("train_gyro")}
        with zipfile.ZipFile(f, "w") as z:
            for n, b in keep.items():
                z.writestr(n, b)
    raw = copy.deepcopy(tiny_scenario(dataset={"name": "har", "path": "har.npz"}))
    raw["population"] = {"devices": 4}
    raw["selection"]["k"] = 2
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    out = tmp_path / "runs"
    rc, err = run_cli(["run", str(p), "--out", str(out), "--no-progress"], capsys)
    assert rc == 2 and "har.npz" in err, err
    assert not out.exists()


@pytest.mark.parametrize("setting, field", [
    ("aggregation.kappa=0", "aggregation.kappa"), ("aggregation.kappa=1.01", "aggregation.kappa"),
    ("aggregation.pi=0", "aggregation.pi"), ("aggregation.pi=1.01", "aggregation.pi"),
    ("selection.k=0", "selection.k"), ("rounds=-1", "rounds"), ("seed=-1", "seed")])
def test_ssca_ranges_and_k_zero(capsys, setting, field):
    path = str(REPO / "scenarios" / "fedmchain_synthetic.yaml")
    rc, err = run_cli(["validate", path, "--set", setting], capsys)
    assert rc == 2 and f"{field}:" in err

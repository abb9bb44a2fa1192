"""`examples/sweep.py`: the sweep example runs and writes its comparison table."""

from helpers import REPO, load_script


def test_the_sweep_example_runs_a_scenario_over_two_seeds(tmp_path):
    sweep = load_script(REPO / "examples" / "sweep.py").sweep
    out = tmp_path / "sweep"
    assert sweep(["--seeds", "1", "2", "--executor", "serial", "--out", str(out),
                  "--set", "rounds=1", str(REPO / "scenarios" / "quickstart.yaml")]) == 0
    assert sorted(p.name for p in (out / "runs").iterdir()) == \
        ["quickstart-seed1", "quickstart-seed2"]
    assert "quickstart" in (out / "comparison.md").read_text()

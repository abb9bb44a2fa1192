import json
import subprocess
import sys

import yaml

from raymm.app.cli import main

from helpers import REPO, tiny_scenario


def _write(tmp_path, raw, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def test_validate_ok(tmp_path, capsys):
    assert main(["validate", str(_write(tmp_path, tiny_scenario()))]) == 0
    assert "valid scenario 'tiny'" in capsys.readouterr().out


def test_invalid_scenario_exit_2_names_every_field_and_writes_nothing(tmp_path, capsys):
    raw = tiny_scenario(**{"selection.name": "bogus", "selection.k": 99})
    raw["population"]["availability"][1]["online"] = 7
    p = _write(tmp_path, raw)
    out = tmp_path / "runs"
    for argv in (["validate", str(p)], ["run", str(p), "--out", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n  - ") == 3 and "Traceback" not in err
        assert "population.availability.1" in err and "d=7" in err
        assert "selection.name: unknown selection policy 'bogus'; choose one of:" in err
        assert "selection.k: K=99" in err
    assert not out.exists()


def test_missing_file_and_bad_override(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "none.yaml")]) == 2
    assert "scenario file not found" in capsys.readouterr().err
    p = _write(tmp_path, tiny_scenario())
    assert main(["validate", str(p), "--set", "rounds"]) == 2
    assert "expected key.path=value" in capsys.readouterr().err
    assert main(["validate", str(p), "--set", "rounds=zero"]) == 2
    assert "rounds:" in capsys.readouterr().err


def test_run_with_overrides_writes_run_dir(tmp_path, capsys):
    p = _write(tmp_path, tiny_scenario())
    out = tmp_path / "runs"
    assert main(["run", str(p), "--set", "rounds=2", "--set", "seed=3", "--out", str(out),
                 "--executor", "serial", "--no-progress"]) == 0
    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["seed"] == 3
    assert "run directory:" in capsys.readouterr().out


def test_entry_point_runs_as_a_program(tmp_path):
    p = _write(tmp_path, tiny_scenario(**{"selection.k": 40}))
    proc = subprocess.run([sys.executable, "-m", "raymm.app.cli", "validate", str(p)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "selection.k" in proc.stderr

"""The run directory (raymm.driver.rundir): the rounds exported as CSV on request, from the
command line, from Python and on resume, with no temporary file left."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from raymm.app.api import run
from raymm.app.cli import main
from raymm.errors import RaymmError

from helpers import resume_from_round_3, tiny_scenario


def _no_temp_files(run_dir):
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".part")]


def test_export_csv_from_the_command_line(tmp_path, capsys):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(tiny_scenario(rounds=4, **{"eval.every": 2})))
    assert main(["run", str(scenario), "--executor", "serial", "--no-progress",
                 "--out", str(tmp_path / "out"), "--export", "csv"]) == 0
    run_dir = next((tmp_path / "out").iterdir())
    assert f"run directory: {run_dir}" in capsys.readouterr().out
    parquet = pd.read_parquet(run_dir / "rounds.parquet")
    csv = pd.read_csv(run_dir / "rounds.csv")
    assert list(csv.columns) == list(parquet.columns)
    # the same numbers, floats to the last bit; rounds without evaluation are empty fields
    pd.testing.assert_frame_equal(csv, parquet, check_dtype=False)
    assert csv["accuracy"].isna().tolist() == [True, False, True, False]
    _no_temp_files(run_dir)
    # without --export there is no CSV
    assert main(["run", str(scenario), "--executor", "serial", "--no-progress",
                 "--out", str(tmp_path / "plain")]) == 0
    assert not list((tmp_path / "plain").glob("*/rounds.csv"))
    # an unknown format is refused by the parser (exit 2), before anything is written
    with pytest.raises(SystemExit) as exc:
        main(["run", str(scenario), "--out", str(tmp_path / "x"), "--export", "xlsx"])
    assert exc.value.code == 2 and not (tmp_path / "x").exists()


def test_export_from_python_and_on_resume(tmp_path):
    with pytest.raises(RaymmError, match="unknown format 'xlsx'"):
        run(tiny_scenario(), out=tmp_path / "never", export=["xlsx"])
    assert not (tmp_path / "never").exists()
    ref = run(tiny_scenario(rounds=5, **{"output.checkpoint_every": 3}), out=tmp_path,
              export="csv")
    pd.testing.assert_frame_equal(pd.read_csv(ref.run_dir / "rounds.csv"),
                                  pd.read_parquet(ref.run_dir / "rounds.parquet"),
                                  check_dtype=False)
    # a resumed run keeps its rounds.csv current without being asked again
    resumed = resume_from_round_3(tmp_path, ref)
    csv = pd.read_csv(resumed.run_dir / "rounds.csv")
    assert list(csv["round"]) == [1, 2, 3, 4, 5]
    pd.testing.assert_frame_equal(csv, pd.read_parquet(resumed.run_dir / "rounds.parquet"),
                                  check_dtype=False)
    _no_temp_files(resumed.run_dir)

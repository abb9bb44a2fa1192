"""`tools/paired_rounds.py`: two checkouts' rounds taken in turns."""

import pytest
import yaml

from helpers import REPO, load_script, tiny_scenario


def script():
    return load_script(REPO / "tools" / "paired_rounds.py")


def test_both_sides_run_every_round_in_turns(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario()))
    rows = script().paired(path, REPO, REPO, 4, [], ["execution.training.path=sequential"],
                           ["execution.training.path=lockstep"])
    assert [r for r, _, _ in rows] == [1, 2, 3, 4]
    assert all(a > 0 and b > 0 for _, a, b in rows)
    text = script().report(rows, skip=2)
    assert "steady rounds 3..4" in text and "b/a median" in text
    assert len(text.splitlines()) == 1 + 2 + 1   # header, two rounds, summary


def test_a_worker_that_fails_is_reported(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario()))
    with pytest.raises(RuntimeError, match="stopped"):
        script().paired(path, REPO, REPO, 3, ["no_such_key=1"], [], [])


def test_a_directory_that_is_not_a_checkout_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        script().main(["scenarios/quickstart.yaml", "--a", str(tmp_path)])
    assert exc.value.code == 2 and "not a raymm checkout" in capsys.readouterr().err

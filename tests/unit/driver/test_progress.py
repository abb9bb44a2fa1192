"""What a run shows while it goes (raymm.driver.progress): the bar's suffix (round, traffic,
the latest accuracy), one stderr line for a round with faults and none for a clean one, no bar
when progress is off."""

from __future__ import annotations

from types import SimpleNamespace

from raymm.driver.progress import advance, postfix, progress_bar, say_faults


def test_the_suffix_shows_the_round_the_traffic_and_the_latest_accuracy() -> None:
    rows = [{"round": 1, "bytes_total": 1 << 20, "accuracy": 0.5},
            {"round": 2, "bytes_total": 3 << 19}]
    assert postfix(rows) == {"round": "2", "traffic": "1.5MiB", "acc": "0.500"}
    assert postfix(rows[1:]) == {"round": "2", "traffic": "1.5MiB"}


def test_faults_are_one_line_on_stderr_and_no_bar_is_drawn_when_off(capsys) -> None:
    say_faults({"round": 4, "selected": 3, "participated": 3}, None)
    assert capsys.readouterr().err == ""
    say_faults({"round": 4, "failed": 1, "selected": 3, "participated": 2}, None)
    assert capsys.readouterr().err == \
        "raymm: round 4: 1 device(s) crashed; 2 of 3 selected contributed\n"
    sc = SimpleNamespace(rounds=5, name="tiny")
    assert progress_bar(sc, False, 0) is None
    advance(None, [{"round": 1, "bytes_total": 0}])          # nothing to move
    bar = progress_bar(sc, True, 2)
    try:
        assert (bar.total, bar.n) == (5, 2)
        advance(bar, [{"round": 3, "bytes_total": 0}])
        assert bar.n == 3
    finally:
        bar.close()

"""`tools/compare_tables.py`: two method tables side by side."""

from helpers import REPO, load_script


def _table(acc: dict[str, tuple[float, float]], wall: float) -> dict:
    rows = {m: {"ACC": list(s), "Acc@B": [s[0] - 0.05, 0.01], "MIR": [1.2, 0.1]}
            for m, s in acc.items()}
    runs = {m: [{"wall_seconds": wall}, {"wall_seconds": wall}] for m in acc}
    return {"rows": rows, "runs": runs}


def test_a_difference_beyond_both_spreads_is_marked_and_rankings_are_given():
    compare = load_script(REPO / "tools" / "compare_tables.py").compare
    a = _table({"fedmchain": (0.70, 0.01), "fedavg": (0.60, 0.02)}, 60.0)
    b = _table({"fedmchain": (0.705, 0.02), "fedavg": (0.75, 0.02)}, 15.0)
    text = compare(a, b, ("sequential", "lock-step"))
    lines = {tuple(c.strip() for c in line.split("|")[1:3]): line
             for line in text.splitlines() if line.startswith("| fed")}
    assert lines[("fedmchain", "ACC")].endswith("| +0.5 |")        # inside the spread
    assert lines[("fedavg", "ACC")].endswith("| +15.0 * |")        # outside both
    assert "| 70.0 ± 1.0 | 70.5 ± 2.0 |" in lines[("fedmchain", "ACC")]
    assert lines[("fedmchain", "MIR")].endswith("| +0.00 |")
    assert "sequential: by ACC, fedmchain > fedavg; runs' wall time 4.0 min" in text
    assert "lock-step: by ACC, fedavg > fedmchain; runs' wall time 1.0 min" in text

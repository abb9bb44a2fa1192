"""`raymm sweep --grid` (raymm.app.grid): values split outside brackets and quotes, malformed
grids refused, points as the product of the settings with readable safe names."""

from __future__ import annotations

import pytest

from raymm.app.grid import grid_name, grid_points, parse_grid, split_values
from raymm.errors import ScenarioError
from raymm.io.paths import name_problems


def test_values_split_outside_brackets_and_quotes():
    assert split_values("1e-3,1e-2") == ["1e-3", "1e-2"]
    assert split_values("[32,32],[64]") == ["[32,32]", "[64]"]
    assert split_values("{a: 1, b: 2},'x,y'") == ["{a: 1, b: 2}", "'x,y'"]
    assert parse_grid("training.lr=1e-3, 1e-2").values == ("1e-3", "1e-2")


@pytest.mark.parametrize("bad, says", [
    ("training.lr", "expected key.path=value1"), ("=1,2", "expected key.path"),
    ("training.lr=1,,2", "empty value"), ("seed=1,2", "use --seeds"),
    ("name=a,b", "not a grid key"), ("training.lr=1,1", "given twice")])
def test_malformed_grids_are_refused(bad, says):
    with pytest.raises(ScenarioError, match=says):
        grid_points([bad])


def test_points_are_the_product_with_readable_safe_names():
    points = grid_points(["training.lr=1e-3,1e-2", "selection.k=10,20"])
    assert [p.suffix for p in points] == ["_lr1e-3_k10", "_lr1e-3_k20", "_lr1e-2_k10",
                                          "_lr1e-2_k20"]
    assert points[1].overrides == ("training.lr=1e-3", "selection.k=20")
    # two keys with one last part: the whole path names them; unsafe characters become '-'
    odd = grid_points(["model.hidden=[32, 32]", "training.hidden=a/b"])
    assert odd[0].suffix == "_model-hidden32-32_training-hiddena-b"
    long = grid_name("x" * 80, grid_points(["training.lr=" + "1" * 40])[0])
    assert len(long) <= 88 and not name_problems(long) and long.startswith("x" * 70)
    assert grid_points([]) == [grid_points([])[0]] and grid_points([])[0].suffix == ""

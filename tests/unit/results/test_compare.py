"""Finding run directories (raymm.results.compare): what is not a run is refused, by the
function and by `raymm compare`."""

import pytest

from raymm.app.cli import main
from raymm.errors import RaymmError
from raymm.results.compare import find_runs


def test_compare_rejects_non_runs(tmp_path, capsys):
    with pytest.raises(RaymmError, match="neither a run directory"):
        find_runs([tmp_path])
    assert main(["compare", str(tmp_path)]) == 2

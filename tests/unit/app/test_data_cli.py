"""`raymm data` (raymm.app.data_cli): `prepare` prints a summary, and every option a
converter takes has a flag."""

from raymm.app.cli import main

from tiny_releases import mosei_pickle as _mosei_pickle
from tiny_releases import npz


def test_cli_prepare_prints_a_summary(tmp_path, capsys):
    src = _mosei_pickle(tmp_path / "m.pkl")
    out = tmp_path / "cli.npz"
    assert main(["data", "prepare", "cmu-mosei", "--from", str(src), "--out", str(out),
                 "--classes", "7", "--no-progress"]) == 0
    line = capsys.readouterr().out
    assert f"prepared cmu-mosei: {out} (train 4, valid 2, test 3;" in line
    assert "text [768]" in line and "7 classes" in line
    assert npz(out)["train_y"].tolist() == [2, 3, 3, 6]


# --------------------------------------------------------------------------- the registry

def test_each_release_module_adds_its_converters_once_and_each_option_has_a_flag():
    """Adding a release is one module in `releases.MODULES`: no converter name may shadow
    another's, and every option a converter takes must reach it from `raymm data prepare`."""
    from raymm.app.data_cli import _OPTIONS
    from raymm.data.releases import CONVERTERS, MODULES, SOURCES

    assert sum(len(m.CONVERTERS) for m in MODULES) == len(CONVERTERS)
    assert sum(m.SOURCE is not None for m in MODULES) == len(SOURCES)
    flags = {flag.lstrip("-").replace("-", "_") for flag, _ in _OPTIONS}
    no_flag = {name: sorted(set(c.options()) - flags) for name, c in CONVERTERS.items()}
    assert not any(no_flag.values()), no_flag

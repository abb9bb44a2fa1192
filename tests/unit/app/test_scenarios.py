"""`raymm scenarios list|copy`: the shipped scenarios, from a checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

from raymm.app import scenarios
from raymm.app.build import load_scenario
from raymm.app.cli import main
from raymm.errors import ScenarioError

from helpers import REPO


def test_a_checkout_ships_its_scenarios_folder():
    assert scenarios.scenario_root() == REPO / "scenarios"
    names = scenarios.scenario_names()
    assert {"quickstart", "bench/standard", "tide_har"} <= set(names)
    assert len(names) == len(list((REPO / "scenarios").rglob("*.yaml")))


def test_the_list_holds_user_scenarios_only_and_each_one_validates():
    """Ablation rows, calibrations and stress populations live with their study in
    experiments/ or with the tools in tools/, never in the shipped list."""
    names = scenarios.scenario_names()
    assert not [n for n in names if "ablation" in n or n.startswith(("stress/", "tide_abl"))]
    assert not [p for p in (REPO / "scenarios").rglob("*") if p.is_file()
                and p.suffix != ".yaml"], "scenarios/ holds YAML only (it ships in the wheel)"
    for name in names:
        try:
            sc = load_scenario(scenarios.find_scenario(name))
        except ScenarioError as exc:   # a dataset this machine lacks: only that may be wrong
            assert all("not found" in p for p in exc.problems), (name, exc.problems)
            continue
        assert sc.rounds >= 1 and not sc.name.startswith("tide_abl"), name


def test_an_installed_wheel_reads_the_copy_inside_the_package(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "raymm"
    (package / "scenarios" / "sub").mkdir(parents=True)
    (package / "scenarios" / "sub" / "one.yaml").write_text("# One.\nname: one\n")
    monkeypatch.setattr(scenarios, "PACKAGE", package)
    assert scenarios.scenario_root() == package / "scenarios"
    assert scenarios.scenario_names() == ["sub/one"]


def test_list_names_and_describes_every_scenario(capsys):
    assert main(["scenarios", "list"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("quickstart "))
    assert "Quickstart: multimodal FedAvg" in line
    assert "bench/standard " in out and "scenarios copy NAME" in out.splitlines()[-1]


def test_copy_writes_the_scenario_and_never_overwrites_silently(tmp_path, capsys):
    assert main(["scenarios", "copy", "quickstart", str(tmp_path)]) == 0
    out = tmp_path / "quickstart.yaml"
    assert out.read_bytes() == (REPO / "scenarios" / "quickstart.yaml").read_bytes()
    assert f"raymm run {out}" in capsys.readouterr().out
    out.write_text("mine")
    assert main(["scenarios", "copy", "quickstart.yaml", str(tmp_path)]) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "mine"
    assert main(["scenarios", "copy", "quickstart", str(out), "--force"]) == 0
    assert out.read_text() != "mine"


def test_copy_finds_a_bare_name_in_a_subfolder_and_names_close_ones(tmp_path, capsys):
    assert scenarios.copy_scenario("standard", tmp_path) == tmp_path / "standard.yaml"
    assert main(["scenarios", "copy", "quikstart", str(tmp_path)]) == 2
    assert "did you mean quickstart" in capsys.readouterr().err
    with pytest.raises(Exception, match="does not exist"):
        scenarios.copy_scenario("quickstart", tmp_path / "no" / "such.yaml")


def test_copy_to_the_working_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["scenarios", "copy", "bench/standard"]) == 0
    assert Path("standard.yaml").is_file()

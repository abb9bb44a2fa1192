"""`raymm scenarios list|copy`: the shipped scenarios, from a checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

from raymm.app import scenarios
from raymm.app.cli import main

from helpers import REPO


def test_a_checkout_ships_its_scenarios_folder():
    assert scenarios.scenario_root() == REPO / "scenarios"
    names = scenarios.scenario_names()
    assert {"quickstart", "bench/standard", "tide_ablations/07_tide"} <= set(names)
    assert len(names) == len(list((REPO / "scenarios").rglob("*.yaml")))


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

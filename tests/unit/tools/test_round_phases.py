"""`tools/round_phases.py`: where a round's time goes, phase by phase."""

import yaml

from helpers import REPO, load_script, tiny_scenario


def script():
    return load_script(REPO / "tools" / "round_phases.py")


def test_phases_are_timed_inside_the_rounds_and_nest(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{"execution.training.path": "lockstep"})))
    fallbacks: list[int] = []
    walls, seconds = script().profile(path, [], 5, tmp_path / "out", fallbacks=fallbacks)
    assert len(walls) == 5 and fallbacks == [0] * 5
    steady = sum(walls[2:])
    host = seconds["host: training (lock-step)"]
    assert 0 < host <= steady
    assert 0 < seconds["    local update (minibatch loop)"] <= host
    assert 0 < seconds["server: aggregation"] < steady - host + 1e-3
    assert seconds["host: training (sequential)"] == 0.0  # every bucket trained in lock-step
    text = script().report(walls, seconds, fallbacks)
    assert "steady round (rounds 3..5)" in text and "optimizer steps" in text
    assert "lock-step fallbacks per round (devices trained sequentially instead): " \
        "[0, 0, 0, 0, 0]" in text


def test_a_sequential_round_is_timed_in_the_sequential_host(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{"execution.training.path": "sequential"})))
    walls, seconds = script().profile(path, [], 3, tmp_path / "out")
    host = seconds["host: training (sequential)"]
    assert 0 < host <= walls[2] and seconds["host: training (lock-step)"] == 0.0
    assert 0 < seconds["    local update (minibatch loop)"] <= host
    assert seconds["  lock-step programs"] == 0.0


def test_every_reported_phase_is_marked_in_the_code():
    """The tool reads the regions by name: each name it reports is a `phase(...)` in raymm."""
    source = "\n".join(p.read_text() for p in (REPO / "raymm").rglob("*.py"))
    assert [name for name, _ in script().PHASES if f'phase("{name}")' not in source] == []


def test_the_classes_are_left_as_they_were(tmp_path):
    """Nothing is patched: the phases are the code's own regions."""
    from raymm.server.server import Server
    from raymm.training.local_update import LocalUpdate

    before = (LocalUpdate.run, Server.plan)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario()))
    script().profile(path, [], 3, tmp_path / "out")
    assert (LocalUpdate.run, Server.plan) == before


def test_too_few_rounds_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        script().main(["scenarios/quickstart.yaml", "--rounds", "2"])
    assert exc.value.code == 2 and "at least 3" in capsys.readouterr().err


def test_kernels_are_counted_by_kind_only_in_the_steady_rounds(tmp_path, monkeypatch):
    from raymm.models.masked import MaskedForward

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{"execution.training.path": "lockstep"})))
    s = script()
    kernels = s.KernelTimer()
    # the run's final evaluation (after one uncounted round) is not counted
    watched_evaluations = []
    own = MaskedForward.__init__
    def spy(self, *args, **kwargs):
        watched_evaluations.append(kernels.on)
        own(self, *args, **kwargs)
    monkeypatch.setattr(MaskedForward, "__init__", spy)
    walls, _ = s.profile(path, [], 4, tmp_path / "out", kernels)
    assert len(walls) == 4
    assert watched_evaluations and not any(watched_evaluations)
    # the tiny model is linear layers only: matrix products and other kernels, no convolutions
    assert kernels.calls["matrix products (mm, bmm, addmm, ...)"] > 0
    assert kernels.calls["other"] > kernels.calls["matrix products (mm, bmm, addmm, ...)"]
    assert kernels.calls["convolution forward"] == kernels.calls["convolution backward"] == 0
    assert 0 < sum(kernels.seconds.values()) < sum(walls[2:])
    text = s.kernel_report(kernels, 2)
    assert "convolution backward" in text and "other" in text


def test_ablations_report_each_change(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario()))
    assert script().main([str(path), "--rounds", "3", "--out", str(tmp_path / "o"),
                          "--ablate", "training.local_epochs=2"]) == 0
    out = capsys.readouterr().out
    assert "ablations" in out and "training.local_epochs=2" in out


def test_operations_are_named_with_the_code_that_ran_them(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{"execution.training.path": "lockstep"})))
    assert script().main([str(path), "--rounds", "4", "--out", str(tmp_path / "o"),
                          "--kernels", "--ops", "1000"]) == 0
    out = capsys.readouterr().out
    listing = out.split("top 1000 operations per steady round (ms, calls, where):\n")[1]
    rows = [line.split() for line in listing.splitlines()]
    assert rows and all(r[4].startswith("(") for r in rows)
    ms = [float(r[0]) for r in rows]
    assert ms == sorted(ms, reverse=True)
    sites = {(r[2], r[3]) for r in rows}
    # a linear layer's product runs in the model's forward and again in the reverse pass,
    # which is named by the line of the lock-step step that asks for the gradient
    assert any(op == "bmm" and site.startswith("raymm/training/lockstep/gradients.py:")
               for op, site in sites), listing
    assert any(op == "bmm" and site.startswith("raymm/models/") for op, site in sites), listing


def test_a_call_site_is_in_the_packages_not_any_path_that_names_them():
    """Code under a folder named like a package (a virtualenv in `~/.cache/raymm/`) is not
    the project's: the site is the innermost frame inside the packages' own folders."""
    ns: dict = {}
    exec(compile("def lib(f):\n    return f()\n", "/tmp/.cache/raymm/venv/torch/lib.py", "exec"),
         ns)
    assert ns["lib"](script().call_site) == "(outside the project)"
    from raymm.device import warmup

    s = script()
    kernels = s.KernelTimer(sites=True)
    kernels.on = True
    with kernels.mode:
        warmup.warm_up_transforms()   # a vmapped product and its gradient, inside raymm
    sites = {site for op, site in kernels.op_seconds if op == "bmm"}
    assert {x.split(" ")[1] for x in sites} == {"(loss)", "(warm_up_transforms)"}
    assert all(x.startswith("raymm/device/warmup.py:") for x in sites)


def test_ops_needs_kernels(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        script().main(["scenarios/quickstart.yaml", "--ops", "3"])
    assert exc.value.code == 2 and "--ops" in capsys.readouterr().err

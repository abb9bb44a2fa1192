"""Plugins (raymm.app.plugins): names registered from outside the package, loaded by entry point
or by name, never by a scenario; clear refusals; the example distribution examples/mylab and
docs/extending.md, which quotes it.

The example's package is copied into a temporary folder put on sys.path for the test, so
nothing depends on it being installed; every test leaves the registries as it found them.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import raymm
from raymm.app import plugins, schema_doc
from raymm.app.api import run
from raymm.app.build import load_scenario, method_names
from raymm.app.cli import main
from raymm.app.sweep import run_sweep
from raymm.data.base import DATASETS
from raymm.errors import RaymmError, ResumeError, ScenarioError
from raymm.models.layout import GroupLayout
from raymm.protocol.registry import METHODS, PRESETS, SELECTORS, register_preset, unregister_preset

from helpers import REPO, tiny_scenario

EXAMPLE = REPO / "examples" / "mylab"
SCENARIO = EXAMPLE / "scenario.yaml"
GUIDE = REPO / "docs" / "extending.md"


@pytest.fixture
def clean_registries(monkeypatch):
    """Whatever a test registers or imports of its own plugins is gone afterwards."""
    monkeypatch.setenv(plugins.NO_ENTRY_POINTS, "1")
    before, modules = plugins._snapshot(), set(sys.modules)
    loaded = dict(plugins._LOADED)
    yield
    plugins._roll_back(before, plugins._snapshot())
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)
    for name in set(sys.modules) - modules:
        if name.partition(".")[0] in ("mylab", "broken_lab", "greedy_lab", "clash_lab",
                                      "typo_lab", "ownpolicy", "lateplug"):
            del sys.modules[name]


@pytest.fixture
def mylab(tmp_path, monkeypatch, clean_registries):
    """The example's package in a folder of its own on sys.path (and nowhere else)."""
    code = tmp_path / "code"
    shutil.copytree(EXAMPLE / "mylab", code / "mylab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(code))
    return code


def write_module(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def table(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


# --------------------------------------------------------------------------- loading


def test_a_named_plugin_registers_what_the_example_defines(mylab):
    (plugin,) = plugins.load(["mylab.fl"])
    assert plugin.source == "named" and plugin.module == "mylab.fl"
    assert {k: plugin.provides[k] for k in ("dataset", "selection", "aggregation", "preset")} == {
        "dataset": ["mylab_blobs"], "selection": ["mylab_most_data"],
        "aggregation": ["mylab_median"], "preset": ["mylab_robust"]}
    assert "mylab_blobs" in DATASETS and "mylab_most_data" in SELECTORS
    assert plugins.origin("aggregation", "mylab_median") == "mylab.fl"
    assert plugins.origin("aggregation", "fedavg") is None
    assert plugins.labelled("preset", ["fedavg", "mylab_robust"]) == [
        "fedavg", "mylab_robust (plugin mylab.fl)"]
    assert "mylab_robust" in method_names()
    assert plugins.load(["mylab.fl"]) == [plugin]  # once per process


def test_unload_leaves_the_registries_as_they_were(mylab):
    before = plugins._snapshot()
    plugins.load(["mylab.fl"])
    plugins.unload("mylab.fl")
    assert plugins._snapshot() == before and "mylab" not in sys.modules
    assert "mylab_robust" not in METHODS


def test_an_installed_distribution_is_found_by_its_entry_point(tmp_path, monkeypatch, capsys,
                                                               clean_registries):
    """A *.dist-info with entry_points.txt on sys.path is what `pip install` leaves;
    importlib.metadata finds it there. `module:function` entry points call the function."""
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE / "mylab", site / "mylab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    write_module(site, "lateplug", "from raymm.protocol.registry import register_preset\n\n"
                 "def register():\n    register_preset('late_method', {'objective': "
                 "{'name': 'ce'}}, ablation=True)\n")
    info = site / "mylab-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[raymm.plugins]\nmylab = mylab.fl\nlate = lateplug:register\n")
    monkeypatch.syspath_prepend(str(site))

    monkeypatch.setattr(plugins, "_entry_points_done", False)
    plugins.load()  # with RAYMM_NO_ENTRY_POINTS=1: not loaded
    assert "mylab_blobs" not in DATASETS and not plugins._entry_points_done

    monkeypatch.delenv(plugins.NO_ENTRY_POINTS)
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert "plugin mylab.fl (entry point mylab (mylab 0.1.0))" in out
    assert "  selection mylab_most_data\n    explore: float = 0.2" in out
    assert "late_method" in PRESETS and "late_method" not in METHODS  # an ablation
    assert main(["validate", str(SCENARIO)]) == 0  # no --plugin needed
    assert "valid scenario 'mylab_demo'" in capsys.readouterr().out


# --------------------------------------------------------------------------- refusals

BROKEN = """from raymm.protocol.registry import SELECTORS
from raymm.protocol.seams import Selector


@SELECTORS.register("broken_lab_pick")
class Pick(Selector):
    def select(self, ctx):
        return ctx.eligible[: ctx.k]


raise RuntimeError("calibration file missing")
"""


def test_a_plugin_that_raises_is_one_message_and_exit_2(tmp_path, monkeypatch, capsys,
                                                        clean_registries):
    path = write_module(tmp_path / "code", "broken_lab", BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(tiny_scenario()))
    for argv in (["validate", str(scenario)], ["run", str(scenario), "--out",
                                               str(tmp_path / "runs")]):
        assert main([*argv, "--plugin", "broken_lab"]) == 2
        err = capsys.readouterr().err
        assert err == (f"raymm: plugin 'broken_lab' (named) failed to import: RuntimeError: "
                       f"calibration file missing ({path}, line 11)\n")
        # what it registered before raising is taken back, and it is imported afresh next time
        assert "broken_lab_pick" not in SELECTORS and "broken_lab" not in sys.modules
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, text, message", [
    ("mylab/fl.py", None, "--plugin 'mylab/fl.py': not a module name; give a dotted Python "
                          "module name such as mylab.fl (a file mylab/fl.py is the module "
                          "mylab.fl)"),
    ("nosuch_lab.fl", None, "plugin 'nosuch_lab.fl' (named): no module named 'nosuch_lab' on "
                            "the Python path"),
    ("greedy_lab", "from raymm.data.base import register_dataset\n\n\n"
                   "@register_dataset('synthetic')\nclass Mine:\n    pass\n",
     "plugin 'greedy_lab' (named) replaced what was registered before it: dataset "
     "'synthetic'; register under other names"),
    ("clash_lab", "from raymm.protocol.registry import SELECTORS\n"
                  "from policies.selection.fair import LeastSelected\n\n"
                  "SELECTORS.register('random')(LeastSelected)\n",
     "plugin 'clash_lab' (named) failed to import: ValueError: selection policy 'random' is "
     "registered twice ("),
    ("typo_lab", "def oops(:\n    pass\n", "plugin 'typo_lab' (named) failed to import: "
                                             "SyntaxError: "),
])
def test_plugin_mistakes_are_named(tmp_path, monkeypatch, clean_registries, name, text,
                                   message):
    synthetic = DATASETS["synthetic"]
    if text is not None:
        write_module(tmp_path / "code", name, text)
        monkeypatch.syspath_prepend(str(tmp_path / "code"))
    with pytest.raises(plugins.PluginError) as refused:
        plugins.load([name])
    assert str(refused.value).startswith(message), str(refused.value)
    assert DATASETS["synthetic"] is synthetic and name not in sys.modules
    assert SELECTORS.get("random").__name__ == "RandomSelection"


def test_validate_lists_the_plugin_names_among_the_choices(mylab, capsys):
    assert main(["validate", str(SCENARIO)]) == 2  # the plugin is not loaded
    err = capsys.readouterr().err
    assert "method: unknown preset 'mylab_robust'; choose one of: blossom, blossom_ph" in err
    assert err.rstrip().endswith("or load the plugin that registers it (--plugin MODULE)")
    assert main(["validate", str(SCENARIO), "--plugin", "mylab.fl",
                 "--set", "aggregation.name=mylab_mean"]) == 2
    err = capsys.readouterr().err
    assert "aggregation.name: unknown aggregation policy 'mylab_mean'; choose one of: " in err
    assert "mylab_median (plugin mylab.fl)" in err


def test_a_scenario_never_imports_a_module(mylab):
    """`mylab` is importable here, yet naming it in a scenario imports nothing."""
    for raw in ({**tiny_scenario(), "plugins": ["mylab.fl"]},
                tiny_scenario(dataset={"name": "mylab.fl"}),
                tiny_scenario(**{"aggregation.name": "mylab.policies:CoordinateMedian"})):
        with pytest.raises(ScenarioError):
            load_scenario(raw)
        assert "mylab" not in sys.modules


def test_register_preset_rules(clean_registries):
    with pytest.raises(ValueError, match="use letters, digits"):
        register_preset("my method", {})
    with pytest.raises(ValueError, match="'plugins' cannot be set by a preset"):
        register_preset("mine", {"plugins": ["x"]})
    register_preset("mine", {"objective": {"name": "ce"}})
    register_preset("mine", {"objective": {"name": "ce"}})  # the same again: fine
    with pytest.raises(ValueError, match="registered twice"):
        register_preset("mine", {"objective": {"name": "fedprox"}})
    assert METHODS[-1] == "mine"
    unregister_preset("mine")
    assert "mine" not in PRESETS and "mine" not in METHODS


# --------------------------------------------------------------------------- listings


def test_listings_show_plugin_names_and_parameters(mylab, capsys):
    reference = schema_doc.render()
    assert main(["plugins", "list", "--plugin", "mylab.fl"]) == 0
    out = capsys.readouterr().out
    assert "plugin mylab.fl (named)" in out
    assert ("  dataset mylab_blobs\n    n_train: int = 600  (training samples (devices "
            "partition these))") in out
    assert "  preset mylab_robust\n    selection.name: 'mylab_most_data'" in out
    assert main(["data", "list", "--plugin", "mylab.fl"]) == 0
    assert re.search(r"\n  mylab_blobs +built in / generated  \(plugin mylab.fl\)\n",
                     capsys.readouterr().out)
    # the reference of raymm's own is the same with a plugin loaded; plugins come after it
    assert schema_doc.render() == reference and "mylab" not in reference
    full = schema_doc.render(with_plugins=True)
    assert full.startswith(reference.rstrip("\n"))
    for line in ("# Plugins", "## plugin `mylab.fl`", "### `selection: {name: mylab_most_data}`",
                 "| `explore` | float | `0.2` | share of the K places given to devices drawn "
                 "uniformly at random instead |", "### `method: mylab_robust`",
                 "| `aggregation.name` | `'mylab_median'` |"):
        assert line in full, line


LABNETS = """from torch import nn

from raymm.models.factory import register_model


class FirstSensor(nn.Module):
    def __init__(self, sensor, width, classes):
        super().__init__()
        self.sensor, self.head = sensor, nn.Linear(width, classes)

    def forward(self, inputs):
        return self.head(inputs[self.sensor])


@register_model("labnets_linear")
def linear(ctx):
    \"\"\"One linear layer over the first sensor.\"\"\"
    first = ctx.sensors[0]
    return FirstSensor(first, ctx.shapes[first][0], ctx.num_classes)
"""


def test_a_model_factory_from_a_plugin_is_listed(tmp_path, monkeypatch, capsys,
                                                 clean_registries):
    write_module(tmp_path / "code", "labnets_unit", LABNETS)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    try:
        (plugin,) = plugins.load(["labnets_unit"])
        assert plugin.provides == {"model": ["labnets_linear"]}
        assert main(["plugins", "list"]) == 0
        assert "plugin labnets_unit (named)\n  model labnets_linear" in capsys.readouterr().out
        assert "### `model: {factory: labnets_linear}`\n\nOne linear layer over the first " \
               "sensor." in schema_doc.render(with_plugins=True)
        sc = load_scenario(tiny_scenario(model={"factory": "labnets_linear"}))
        assert plugins.worker_modules(sc) == ["labnets_unit"]
    finally:
        plugins.unload("labnets_unit")


# --------------------------------------------------------------------------- runs


def test_a_run_records_its_plugins_and_resuming_needs_them(mylab, tmp_path, capsys):
    # serial: the plugins on Ray are tests/integration/test_plugins_ray.py's
    sets = ["rounds=7", "eval.every=2", "output.checkpoint_every=3", "execution.executor=serial"]
    ref = run(SCENARIO, sets, out=tmp_path / "ref", plugins=["mylab.fl"])
    record = (ref.run_dir / plugins.RECORD).read_text()
    assert '"module": "mylab.fl"' in record and '"source": "named"' in record
    copy = tmp_path / "copy"
    shutil.copytree(ref.run_dir, copy)
    for later in sorted((copy / "checkpoints").glob("round-*.safetensors"))[1:]:
        later.unlink()
    plugins.unload("mylab.fl")
    with pytest.raises(ResumeError, match=re.escape(
            f"resume with `raymm run --resume {copy} --plugin mylab.fl`")):
        run(resume=copy)
    assert main(["run", "--resume", str(copy)]) == 2
    assert "which are not loaded" in capsys.readouterr().err
    assert "mylab" not in sys.modules  # the run directory imported nothing
    res = run(resume=copy, plugins=["mylab.fl"])
    for g in ref.params:
        assert np.array_equal(res.params[g], ref.params[g]), g
    pd.testing.assert_frame_equal(table(res.run_dir), table(ref.run_dir), check_exact=True)


OWN_POLICY = """from policies.aggregation.fedavg import FedAvg
from raymm.protocol.registry import AGGREGATORS


@AGGREGATORS.register("ownpolicy_mean")
class OwnMean(FedAvg):
    pass
"""


def test_what_travels_to_workers_and_child_processes(mylab, tmp_path, monkeypatch):
    plugins.load(["mylab.fl"])
    sc = load_scenario(SCENARIO)
    assert plugins.worker_code(sc) == (["mylab.fl"], [str(mylab / "mylab")])
    assert plugins.child_plugins(sc) == ["mylab.fl"]
    assert plugins.search_paths(["mylab.fl"]) == [str(mylab.resolve())]
    # a policy module the caller imported itself travels too (and is recorded)
    write_module(tmp_path / "own", "ownpolicy", OWN_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path / "own"))
    import ownpolicy  # noqa: F401

    sc = load_scenario(SCENARIO, ["aggregation.name=ownpolicy_mean"])
    modules, paths = plugins.worker_code(sc)
    assert modules == ["mylab.fl", "ownpolicy"]
    assert paths == [str(mylab / "mylab"), str(tmp_path / "own" / "ownpolicy.py")]
    assert plugins.child_plugins(sc) == ["mylab.fl", "ownpolicy"]


def test_sweep_jobs_in_processes_of_their_own_load_the_plugins(mylab, tmp_path):
    sets = ["rounds=2", "eval.every=2", "execution.executor=serial"]
    comp = run_sweep([SCENARIO], overrides=sets, out=tmp_path / "sweep", jobs=2,
                     plugins=["mylab.fl"])
    assert comp.failed == []
    here = run(SCENARIO, sets, out=tmp_path / "here")
    child = tmp_path / "sweep" / "runs" / "mylab_demo-seed3"
    pd.testing.assert_frame_equal(table(child), table(here.run_dir), check_exact=True)
    assert (child / plugins.RECORD).is_file()


# --------------------------------------------------------------------------- the guide


def test_the_guide_quotes_the_example_as_it_is():
    """Every code block but shell commands and output is quoted verbatim from the last
    examples/ file the text named before it."""
    text = GUIDE.read_text()
    quoted = 0
    for m in re.finditer(r"```(\w*)\n(.*?)```", text, flags=re.S):
        lang, block = m.groups()
        if lang in ("", "bash", "text"):
            continue
        files = re.findall(r"`(examples/[\w/.]+)`", text[:m.start()])
        assert files, block[:60]
        assert block in (REPO / files[-1]).read_text(), (files[-1], block[:200])
        quoted += 1
    assert quoted >= 6
    for path in set(re.findall(r"`((?:examples|raymm|tests|docs)/[\w/.]+\.\w+)`", text)):
        assert (REPO / path).is_file(), path


def test_the_example_declares_its_entry_point():
    text = (EXAMPLE / "pyproject.toml").read_text()
    assert f'[project.entry-points."{plugins.ENTRY_POINT_GROUP}"]\nmylab = "mylab.fl"\n' in text


def test_a_plugin_model_trains_and_loads_back_with_its_plugin(mylab, tmp_path):
    """The example's model factory (parts with batch norm) runs, and `raymm.load_model` rebuilds
    it once the plugin is named (a run directory never imports code by itself)."""
    sets = ["model.factory=mylab_wearable", "method=fedavg", "selection={name: random, k: 5}",
            "model.buffers=local", "rounds=3", "execution.executor=serial"]
    res = run(SCENARIO, sets, out=tmp_path, plugins=["mylab.fl"])
    plugins.unload("mylab.fl")
    with pytest.raises(RaymmError, match="unknown model factory 'mylab_wearable'"):
        raymm.load_model(res.run_dir)
    net = raymm.load_model(res.run_dir, device=0, plugins=["mylab.fl"])
    assert set(net.encoders) == {"accel", "mic"} and net.heads is not None
    flat = GroupLayout(net, "local").flatten(net)
    assert all(np.array_equal(flat[g], v) for g, v in res.params.items())


BROKEN_LOADER = '''
import numpy as np
from pydantic import BaseModel, ConfigDict
from raymm.data.base import Dataset, Split, register_dataset


class P(BaseModel):
    model_config = ConfigDict(extra="forbid")


@register_dataset("shapeless_blobs")
class Shapeless:
    Params = P

    def sensors(self, params):
        return ("a",)

    def required_files(self, params):
        return []

    def load(self, params, seed):
        x = np.zeros((40, 3), np.float32)
        test = np.zeros((20, 4), np.float32)          # test samples of another shape
        return Dataset("shapeless_blobs", ("a",), 2, Split({"a": x}, np.zeros(39, np.int64)),
                       Split({"a": test}, np.zeros(20, np.int64)))
'''


def test_a_loader_breaking_the_data_contract_is_one_message_naming_shapes(tmp_path,
                                                                          monkeypatch, capsys,
                                                                          clean_registries):
    write_module(tmp_path / "code", "shapeless_lab", BROKEN_LOADER)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    scenario_file = tmp_path / "s.yaml"
    scenario_file.write_text(yaml.safe_dump(tiny_scenario(
        dataset={"name": "shapeless_blobs"}, population={"devices": 4},
        selection={"name": "random", "k": 2})))
    out = tmp_path / "runs"
    assert main(["run", str(scenario_file), "--plugin", "shapeless_lab", "--out", str(out),
                 "--executor", "serial"]) == 2
    err = capsys.readouterr().err
    assert "dataset 'shapeless_blobs': train.x['a'] has 40 rows for 39 labels" in err
    assert "test.x['a'] samples are [4], the training split's are [3]" in err
    assert not out.exists() or not any(out.iterdir())  # nothing written

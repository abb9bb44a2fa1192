"""Keys read under an older name (`raymm.config.renamed`): moved to their new place with one
notice, overridable from the command line, refused beside their new spelling; every committed
run's config.yaml still loads, and no committed scenario uses an old name."""

import pytest

from raymm.app.build import load_scenario
from raymm.config.renamed import RENAMED, migrate
from raymm.errors import ScenarioError

from helpers import REPO, tiny_scenario
from needs import dataset_files

OLD = {"training.vectorise": False, "training.vectorise_chunk": 7,
       "training.closed_form": False, "training.threads": 2, "execution.device": "cpu"}


def test_every_old_key_reads_under_its_new_name_with_one_notice(capsys):
    sc = load_scenario(tiny_scenario(**OLD))
    ex = sc.execution
    assert (ex.training.path, ex.training.chunk, ex.training.closed_form, ex.training.threads,
            ex.accelerator) == ("sequential", 7, False, 2, "cpu")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raymm: notice:")
    for old, (new, _) in RENAMED.items():
        assert f"{'.'.join(old)} -> {'.'.join(new)}" in err[0]
    load_scenario(tiny_scenario(**OLD))
    assert capsys.readouterr().err == ""           # said once per process
    assert load_scenario(tiny_scenario(**{"training.vectorise": True})) \
        .execution.training.path == "lockstep"


def test_new_names_load_silently_and_equal_the_old_ones(capsys):
    new = load_scenario(tiny_scenario(**{"execution.training": {
        "path": "sequential", "chunk": 7, "closed_form": False, "threads": 2},
        "execution.accelerator": "cpu"}))
    assert capsys.readouterr().err == ""
    assert new == load_scenario(tiny_scenario(**OLD))


def test_an_old_key_on_the_command_line_overrides_the_files_new_one(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{"execution.training.path": "lockstep"})))
    sc = load_scenario(path, ["training.vectorise=false"])
    assert sc.execution.training.path == "sequential"


def test_an_old_key_beside_its_new_one_is_refused_naming_both():
    with pytest.raises(ScenarioError) as exc:
        load_scenario(tiny_scenario(**{"training.vectorise": False,
                                       "execution.training.path": "lockstep"}))
    assert any("training.vectorise" in p and "execution.training.path" in p
               for p in exc.value.problems)


def test_migrate_leaves_its_input_alone():
    raw = tiny_scenario(**{"training.vectorise": False})
    out, renames, problems = migrate(raw)
    assert raw["training"]["vectorise"] is False and "vectorise" not in out["training"]
    assert renames == ["training.vectorise -> execution.training.path"] and problems == []


RUN_CONFIGS = sorted((REPO / "results").rglob("config.yaml"))


def test_there_are_committed_run_configs():
    assert len(RUN_CONFIGS) > 100


@pytest.mark.parametrize("path", RUN_CONFIGS[::9], ids=lambda p: str(p.relative_to(REPO)))
def test_a_committed_runs_config_still_loads(path):
    """Every ninth (the rest are the same sections with other values; the schema sees all of
    them in `test_every_committed_run_config_passes_the_schema`)."""
    from raymm.config.schema import read_yaml

    dataset_files(read_yaml(path).get("dataset", {}))
    sc = load_scenario(path)
    assert sc.rounds >= 1


def test_every_committed_run_config_passes_the_schema():
    """The schema alone (no data, no policies): every committed config.yaml, old names moved."""
    from raymm.config.schema import Scenario, read_yaml

    for path in RUN_CONFIGS:
        Scenario.model_validate(migrate(read_yaml(path))[0])


def test_no_committed_scenario_uses_an_old_name():
    from raymm.config.schema import read_yaml

    for folder in ("scenarios", "experiments", "tools"):
        for path in (REPO / folder).rglob("*.yaml"):
            assert migrate(read_yaml(path))[1] == [], path


def test_a_run_checkpointed_before_the_rename_resumes_exactly(tmp_path):
    """A run directory written when the engine's switches sat under `training` (its
    config.yaml and its checkpoint's scenario digest in that layout) resumes and ends where an
    uninterrupted run does."""
    import dataclasses
    import shutil

    import numpy as np
    import yaml

    from raymm.app.api import run
    from raymm.driver import checkpoint

    ref = run(tiny_scenario(**{"rounds": 5, "output.checkpoint_every": 3}), out=tmp_path)
    old = tmp_path / "old"
    shutil.copytree(ref.run_dir, old)
    config = yaml.safe_load((old / "config.yaml").read_text())
    engine = config["execution"].pop("training")
    config["execution"]["device"] = config["execution"].pop("accelerator")
    config["training"].update(threads=engine["threads"], vectorise=engine["path"] == "lockstep",
                              vectorise_chunk=engine["chunk"], closed_form=engine["closed_form"])
    (old / "config.yaml").write_text(yaml.safe_dump(config))
    ckpt = checkpoint.load(old)
    assert ckpt.round == 3
    then = checkpoint.scenario_digest(config)
    assert then != ckpt.scenario_digest
    checkpoint.save(old, dataclasses.replace(ckpt, scenario_digest=then))
    res = run(resume=old)
    assert res.summary["rounds_completed"] == 5
    for g in ref.params:
        assert np.array_equal(ref.params[g], res.params[g]), g

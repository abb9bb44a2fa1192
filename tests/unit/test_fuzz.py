"""Property tests: hostile scenarios, command lines and checkpoint files never escape as a
traceback or a hang, and never write outside --out (see tests/fuzz_scenarios.py)."""

import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_scenarios import HOSTILE, base_scenarios, call, case, mutate

TALLY: dict[str, int] = {}
SETTINGS = dict(deadline=None, derandomize=bool(os.environ.get("CI")),
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
BASES = base_scenarios()


def count(kind):
    TALLY[kind] = TALLY.get(kind, 0) + 1


@settings(max_examples=250, **SETTINGS)
@given(rng=st.randoms(use_true_random=False))
def test_mutated_scenarios(rng, tmp_path_factory):
    outcome = case(mutate(rng, rng.choice(BASES)), tmp_path_factory.mktemp("f") / "c")
    count("scenario:" + outcome.split(":")[0])
    assert outcome.split(":")[0] in ("exit0", "exit2", "skipped_run"), outcome


KEYS = st.one_of(st.sampled_from(["rounds", "seed", "name", "selection.k", "training.lr",
                                  "population.devices", "model.embed_dim", "dataset.name",
                                  "population.tiers", "output.dir", "faults.actor_kill_prob",
                                  "aggregation", "a..b", ".", "x" * 200, "ü.ñ"]),
                 st.text(max_size=12))
RAW_VALUES = st.one_of(st.sampled_from(["[", "{a: 1, a: 2}", ".inf", ".nan", "1e7",
                                        "2" * 40, "true", "~", "!!python/object:os.system",
                                        "&a [*a]", "[" * 100, "'\x00'", "\x1b[31m"]),
                       st.text(max_size=20), st.integers().map(str))


@settings(max_examples=80, **SETTINGS)
@given(items=st.lists(st.tuples(KEYS, RAW_VALUES), min_size=1, max_size=3),
       out=st.sampled_from(["runs", "/dev/null", "/proc/x", "\x00", "ü/ñ", "a" * 300]))
def test_hostile_command_lines(items, out, tmp_path_factory):
    from helpers import REPO

    work = tmp_path_factory.mktemp("cli")
    argv = ["run", str(REPO / "scenarios" / "quickstart.yaml"), "--executor", "serial",
            "--no-progress", "--out", out if out.startswith("/") else str(work / out)]
    for k, v in items:
        argv += ["--set", f"{k}={v}"]
    argv += ["--set", "rounds=1", "--set", "population.devices=12", "--set", "selection.k=3"]
    rc, err = call(argv, 120)
    count(f"cli:{rc}")
    assert rc in (0, 2), err


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    from raymm.app.api import run

    from helpers import tiny_scenario

    return run(tiny_scenario(rounds=4, **{"output.checkpoint_every": 2, "model.adapter": True,
                                          "objective": {"name": "ce", "adapter": True}}),
               out=tmp_path_factory.mktemp("ck")).run_dir


@settings(max_examples=30, **SETTINGS)
@given(edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1,
                      max_size=6), cut=st.one_of(st.none(), st.floats(0, 1)))
def test_damaged_checkpoints_resume_or_exit_2(edits, cut, checkpointed, tmp_path_factory):
    import shutil

    run_dir = tmp_path_factory.mktemp("r") / "run"
    shutil.copytree(checkpointed, run_dir)
    for p in sorted((run_dir / "checkpoints").iterdir()):
        data = bytearray(p.read_bytes())
        for where, byte in edits:
            data[int(where * (len(data) - 1))] = byte
        if cut is not None:
            data = data[: int(cut * len(data))]
        p.write_bytes(bytes(data))
    rc, err = call(["run", "--resume", str(run_dir), "--no-progress"], 120)
    count(f"resume:{rc}")
    assert rc in (0, 2), err
    if rc == 2:
        assert "verifies" in err or "does not fit" in err, err


@settings(max_examples=100, **SETTINGS)
@given(blob=st.binary(max_size=400))
def test_random_bytes_are_never_a_checkpoint(blob, tmp_path_factory):
    from raymm.io import statefile

    p = tmp_path_factory.mktemp("b") / "x.safetensors"
    p.write_bytes(blob)
    with pytest.raises(statefile.StateFormatError):
        statefile.read(p, "raymm-checkpoint")
    count("bytes:refused")


def test_hostile_values_cover_every_kind():
    kinds = {type(v).__name__ for v in HOSTILE}
    assert {"NoneType", "bool", "int", "float", "str", "list", "dict"} <= kinds
    assert any(isinstance(v, float) and v != v for v in HOSTILE)  # NaN
    assert random.Random(0).random() == random.Random(0).random()


def test_report_fuzz_tally(capsys):
    """Not a behaviour test: prints what the property tests above saw (outcome counts)."""
    with capsys.disabled():
        print(f"\nfuzz tally: {json.dumps(dict(sorted(TALLY.items())))}")
    assert not any(k.endswith((":traceback", ":hang")) for k in TALLY)

"""The unit tests mirror the packages: the test of module `raymm/<sub>/<mod>.py` is
`tests/unit/<sub>/test_<mod>.py` (`raymm/<mod>.py`: `tests/unit/test_<mod>.py`;
`policies/...` and `actors/...` under `tests/unit/policies/` and `tests/unit/actors/`; the
scripts of tools/ and examples/ under `tests/unit/tools/` and `tests/unit/examples/`).

Every module has its test file or is on `EXEMPT` with the reason (the test that covers it);
every test file is named after a module that exists, or is on `CROSS_CUTTING` (tests of no
single module, at the root). Both lists are checked against the tree, so neither goes stale.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO

UNIT = REPO / "tests" / "unit"
#: the roots whose modules have mirrored tests, and the scripts' folders (files, not packages)
PACKAGES = ("raymm", "policies", "actors")
SCRIPTS = ("tools", "examples")

#: modules (or whole packages, ending in "/") without a test file of their own: why
EXEMPT: dict[str, str] = {
    "actors/": "the Ray layer: tests/integration/ runs it on a real local Ray (its parts that "
               "need no Ray have their files here)",
    "policies/examples/": "the worked examples of docs/adding-a-policy.md: "
                          "test_example_policies.py runs each by hand and in a tiny run",
    "raymm/app/resume.py": "continuing a run: every exact-resume test (helpers.resume_from_"
                           "round_3), e.g. sim/test_async_loop.py, server/test_clock.py",
    "raymm/app/schema_doc.py": "generates docs/scenario.md: "
                               "test_docs.py::test_scenario_reference_is_current",
    "raymm/app/sweep_cluster.py": "a sweep on a Ray cluster: "
                                  "tests/integration/test_cluster_sweep.py",
    "raymm/data/releases/audiovisual.py": "the audio and frames of the crema-d and ave "
                                          "converters: data/releases/test_crema_d.py, "
                                          "data/releases/test_ave.py",
    "raymm/data/releases/common.py": "what a release declares and its converters share: "
                                     "data/test_download.py and each release's test",
    "raymm/device/evaluation.py": "a device's own evaluation, against whole forward passes: "
                                  "models/test_masked.py::"
                                  "test_evaluate_device_counts_match_whole_passes",
    "raymm/driver/loop.py": "the round loop of every run test: stopping in app/test_api.py, "
                            "interrupting and resuming in app/test_sweep.py",
    "raymm/driver/pictures.py": "a run's pictures: "
                                "results/test_tables.py::test_tensorboard_pictures_and_layout",
    "raymm/sim/allocator.py": "tunes glibc's allocator in long-lived processes and changes no "
                              "result (docs/performance.md, 'Freed memory kept in the heap')",
    "raymm/sim/serial.py": "the in-process executor every run test uses; its packings: "
                           "protocol/test_combine.py, device/test_host.py",
    "raymm/training/lockstep/gradients.py": "the gradient of a lock-step step: "
                                            "training/lockstep/test_closed_form.py::"
                                            "test_the_closed_form_gives_autograds_loss_and_"
                                            "gradients, training/lockstep/test_trainer.py",
    "raymm/units.py": "two constants; protocol/test_traffic.py counts bytes with them",
}

#: test files at tests/unit/ that test no single module: why
CROSS_CUTTING: dict[str, str] = {
    "test_architecture.py": "the package order of docs/architecture.md, over every module",
    "test_bad_input.py": "bad input end to end through the command line",
    "test_cluster_yaml.py": "the Ray cluster launcher configs (cluster*.yaml)",
    "test_data_fixtures.py": "the data fixtures of tests/fixtures/data, their loaders and runs",
    "test_docs.py": "the docs that must match the code",
    "test_example_policies.py": "the worked examples of docs/adding-a-policy.md",
    "test_fedmchain_run.py": "FedMChain end to end: chain schedule, MCFT, SSCA and the delta "
                             "exchange in runs of the shipped scenario",
    "test_fuzz.py": "property tests of the whole command line, scenarios and checkpoints",
    "test_hostile_input.py": "hostile input end to end: names, YAML, files, sizes",
    "test_layout.py": "this check",
    "test_matplotlib_backend.py": "nothing raymm imports changes matplotlib's backend",
    "test_privacy_audit.py": "an attack on both halves of differential privacy "
                             "(tests/privacy_audit.py)",
    "test_scenarios.py": "every scenario file in the repository validates and builds",
    "test_tide_scenarios.py": "the TIDE ablation scenario files and their generator",
}


def modules() -> list[str]:
    """Every module of the packages, as a path from the repository (no `__init__.py`)."""
    return sorted(str(p.relative_to(REPO)) for root in PACKAGES
                  for p in (REPO / root).rglob("*.py") if p.name != "__init__.py")


def mirror_of(module: str) -> Path:
    """Where the test of `module` (a path from the repository) lives."""
    path = Path(module)
    parts = path.parts[1:-1] if path.parts[0] == "raymm" else path.parts[:-1]
    return UNIT.joinpath(*parts, f"test_{path.stem}.py")


def module_of(test: Path) -> Path:
    """The module (or script) a test file below tests/unit/<sub>/ is named after."""
    folder = test.parent.relative_to(UNIT).parts
    name = test.name.removeprefix("test_")
    if folder[0] in (*PACKAGES[1:], *SCRIPTS):
        return REPO.joinpath(*folder, name)
    return REPO.joinpath("raymm", *folder, name)


def exempted(module: str) -> bool:
    return module in EXEMPT or any(k.endswith("/") and module.startswith(k) for k in EXEMPT)


def test_every_module_has_its_test_file_or_a_reason() -> None:
    missing = [f"{m} (no {mirror_of(m).relative_to(REPO)})" for m in modules()
               if not mirror_of(m).is_file() and not exempted(m)]
    assert not missing, "modules without a test file; write one or add a reason to EXEMPT:\n" \
        + "\n".join(missing)


def test_every_test_file_is_named_after_a_module_or_is_cross_cutting() -> None:
    orphans = [str(t.relative_to(UNIT)) for t in UNIT.rglob("test_*.py")
               if t.parent != UNIT and not module_of(t).is_file()]
    assert not orphans, "test files named after no module (rename or move them):\n" + \
        "\n".join(orphans)
    tops = {p.stem.removeprefix("test_") for p in (REPO / "raymm").glob("*.py")}
    root = sorted(t.name for t in UNIT.glob("test_*.py")
                  if t.name not in CROSS_CUTTING and t.stem.removeprefix("test_") not in tops)
    assert not root, f"test files at tests/unit/ that are neither a top-level module's " \
                     f"(raymm/<mod>.py) nor on CROSS_CUTTING: {root}"


#: a test file a reason names (from tests/unit/, or from the repository), and a test in it
NAMED = re.compile(r"((?:tests/integration/)?[\w/]*test_\w+\.py)(?:::(test_\w+))?")


def test_the_lists_hold_only_what_is_there() -> None:
    """An exemption names a module without a file of its own, and the tests its reason names
    exist; a cross-cutting file exists."""
    stale = [m for m in EXEMPT if not (REPO / m).exists()
             or not m.endswith("/") and mirror_of(m).is_file()]
    assert not stale, f"EXEMPT entries for modules that are gone or have a test file: {stale}"
    covered = [m for m in EXEMPT if m.endswith("/")
               and all(mirror_of(x).is_file() for x in modules() if x.startswith(m))]
    assert not covered, f"EXEMPT packages whose every module has a test file: {covered}"
    named = []
    for why in EXEMPT.values():
        for path, test in NAMED.findall(why):
            file = REPO / path if path.startswith("tests/") else UNIT / path
            if not file.is_file() or test and f"def {test}(" not in file.read_text():
                named.append(f"{path}::{test}" if test else path)
    assert not named, f"EXEMPT reasons name tests that do not exist: {named}"
    assert not [f for f in CROSS_CUTTING if not (UNIT / f).is_file()]


def test_the_mirror_rule_by_example() -> None:
    """The rule as the layout applies it (and the checks above see what is there)."""
    assert mirror_of("raymm/config/schema.py") == UNIT / "config" / "test_schema.py"
    assert mirror_of("raymm/training/_kernels/lockstep_conv.py") == \
        UNIT / "training" / "_kernels" / "test_lockstep_conv.py"
    assert mirror_of("raymm/phases.py") == UNIT / "test_phases.py"
    assert mirror_of("policies/selection/tide.py") == \
        UNIT / "policies" / "selection" / "test_tide.py"
    assert module_of(UNIT / "tools" / "test_stress.py") == REPO / "tools" / "stress.py"
    assert module_of(UNIT / "actors" / "test_packing.py") == REPO / "actors" / "packing.py"
    assert len(modules()) > 100 and len(EXEMPT) < 20
    assert not list(UNIT.rglob("__init__.py"))      # importlib mode: equal basenames are fine

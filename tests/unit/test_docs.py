"""The docs that must match the code: docs/scenario.md is generated from the schema;
docs/adding-a-policy.md lists every hook of every seam and quotes its examples verbatim."""

import inspect
import re

from raymm.app.schema_doc import render
from raymm.protocol import seams

from helpers import REPO


def test_scenario_reference_is_current():
    committed = (REPO / "docs" / "scenario.md").read_text()
    assert committed == render(), "run: python -m raymm.app.schema_doc > docs/scenario.md"


def test_reference_covers_every_section_and_policy():
    text = render()
    for key in ("population.availability[].period", "execution.actor.num_gpus",
                "faults.deadline_seconds", "training.upload", "objective: {name: ce}",
                "selection: {name: random}", "aggregation: {name: fedavg}"):
        assert key in text, key


# --- docs/adding-a-policy.md: every hook of every seam, and code quoted as it is ----------
ADDING = REPO / "docs" / "adding-a-policy.md"
SEAMS = [seams.Policy, seams.ServerPolicy, seams.Selector, seams.Aggregator,
         seams.Schedule, seams.Objective]


def declared(cls: type) -> set[str]:
    """The public methods and attributes a seam's base class declares itself."""
    names = set(vars(cls)) | set(getattr(cls, "__annotations__", {}))
    return {n for n in names if not n.startswith("_")}


def hook_tables() -> dict[str, str]:
    """Section 8's subsections, by the class named in their heading."""
    every = ADDING.read_text().split("## 8. Every hook", 1)[1]
    parts = re.split(r"^### ", every, flags=re.M)[1:]
    return {re.findall(r"`(\w+)`", p.splitlines()[0])[-1]: p for p in parts}


def test_the_policy_guide_lists_every_hook_of_every_seam():
    tables = hook_tables()
    assert set(tables) == {cls.__name__ for cls in SEAMS}
    for cls in SEAMS:
        rows = re.findall(r"^\| `(\w+)(\(([^)]*)\))?`", tables[cls.__name__], flags=re.M)
        listed = {name for name, _, _ in rows}
        assert declared(cls) <= listed, (cls.__name__, sorted(declared(cls) - listed))
        assert listed <= declared(cls), (cls.__name__, sorted(listed - declared(cls)))
        for name, call, args in rows:  # as written: the parameters the method takes
            if call:
                params = [p for p in inspect.signature(getattr(cls, name)).parameters
                          if p != "self"]
                assert [a.strip() for a in args.split(",") if a.strip()] == params, name


def test_the_policy_guide_quotes_code_as_it_is():
    """A Python block that starts like code of a module (a decorator, `def`, `class`) is
    quoted verbatim from the last `policies/...py` file the text named before it."""
    text = ADDING.read_text()
    quoted = 0
    for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
        block = m.group(1)
        if not block.startswith(("@", "def ", "class ")):
            continue
        files = re.findall(r"`(policies/[\w/]+\.py)`", text[:m.start()])
        assert files, block[:60]
        assert block in (REPO / files[-1]).read_text(), (files[-1], block[:200])
        quoted += 1
    assert quoted >= 5
    for path in set(re.findall(r"`((?:policies|raymm|tests)/[\w/]+\.py)`", text)):
        assert (REPO / path).is_file(), path


def test_the_policy_guide_examples_are_registered():
    import policies  # noqa: F401  (registers every policy)
    from raymm.protocol.registry import AGGREGATORS, OBJECTIVES, SELECTORS

    for name, registries in [("least_selected", [SELECTORS]), ("trimmed_mean", [AGGREGATORS]),
                             ("clipped_delta_mean", [AGGREGATORS]),
                             ("adaptive_prox", [AGGREGATORS, OBJECTIVES])]:
        assert f"| `{name}` |" in ADDING.read_text(), name
        assert all(name in r for r in registries), name

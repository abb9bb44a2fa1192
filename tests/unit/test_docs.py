"""The docs that must match the code: docs/scenario.md is generated from the schema;
docs/adding-a-policy.md lists every hook of every seam and quotes its examples verbatim; the
README stays a guide of a few screens, docs/performance.md a reference page, and no code
points at the dated measurement log (docs/log/)."""

import inspect
import re
from pathlib import Path

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


# --- the README as a guide, the performance page as a reference, the log out of the code --
README = REPO / "README.md"
GUIDE_PAGES = [README, REPO / "CHANGELOG.md", *(REPO / "docs" / n for n in
               ("running.md", "concepts.md", "performance.md"))]


def test_the_readme_is_a_guide_of_a_few_screens():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    text = README.read_text()
    assert "make test" in text   # the test command CI runs (.ci/run)
    assert "raymm run scenarios/quickstart.yaml" in text and "ray up cluster.yaml" in text


def test_the_performance_page_is_a_reference_of_at_most_20_kb():
    size = (REPO / "docs" / "performance.md").stat().st_size
    assert size <= 20 * 1024, f"docs/performance.md is {size} bytes; the log holds the detail"


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings (code blocks left out)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_the_guide_and_its_pages_link_to_what_exists():
    """Every relative link of the README, the changelog and the pages the README's detail
    moved to names a file that exists, and a heading that exists in it."""
    broken = []
    for page in GUIDE_PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_no_code_points_at_the_dated_log():
    """Code comments point at docs/performance.md's sections, never at dated log entries."""
    found = [f"{path.relative_to(REPO)}:{n}"
             for pkg in ("raymm", "actors", "policies", "tests", "tools",
                         "experiments", "examples")
             for path in sorted((REPO / pkg).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if ("docs/log/" in line or "benchmarks.md" in line)
             and path != Path(__file__).resolve()]
    assert not found, found

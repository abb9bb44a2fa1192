"""The dependency direction of DESIGN.md: policies -> raymm, actors -> raymm; never back."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# modules that compose the core with policies/actors (entry points and the docs generator)
COMPOSERS = {"raymm/api.py", "raymm/build.py", "raymm/cli.py", "raymm/schema_doc.py"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def files(pkg: str):
    return sorted((REPO / pkg).rglob("*.py"))


def test_core_never_imports_ray_policies_or_actors():
    for f in files("raymm"):
        rel = f.relative_to(REPO).as_posix()
        bad = imported_roots(f) & ({"ray"} | (set() if rel in COMPOSERS else
                                              {"policies", "actors"}))
        assert not bad, f"{rel} imports {bad}"


def test_policies_never_import_ray_or_actors():
    for f in files("policies"):
        assert not imported_roots(f) & {"ray", "actors"}, f


def test_the_checks_see_imports():
    assert "ray" in imported_roots(REPO / "actors" / "ray_executor.py")
    assert len(files("raymm")) > 10 and len(files("policies")) > 5

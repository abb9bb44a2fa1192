"""The package order of docs/architecture.md, checked over every module.

Each package's `__init__.py` says which packages it may import (`May import: ...`); `base` is
raymm's four leaf modules (errors, phases, seeding, units), which import nothing of raymm. The
test fails on an import that runs back up the order, on an import cycle between modules (a
package's `__init__` importing its own submodules is the one exemption), on a function-level
import (of anything) that is not a deferral with its reason ("# deferred: why"), and on Ray
outside `actors`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import REPO

BASE = ("raymm.errors", "raymm.phases", "raymm.seeding", "raymm.units")
#: the packages whose `__init__.py` declares what they may import
PACKAGES = ["raymm." + p.parent.name for p in sorted((REPO / "raymm").glob("*/__init__.py"))] \
    + ["actors", "policies"]
#: a function-level import says why it is deferred: on its line, or in a comment above the block
#: of imports it belongs to
DEFERRED = re.compile(r"#.*\bdeferred\b", re.I)
IMPORT_LINE = re.compile(r"\s*(from \S+ )?import |\s+\w[\w, ]*\)?$")


def modules() -> dict[str, Path]:
    out = {}
    for root in ("raymm", "actors", "policies"):
        for path in sorted((REPO / root).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def package_of(module: str) -> str:
    """The package a module belongs to for the order: `base`, a raymm subpackage, `actors`,
    `policies`, the root facade `raymm`, or a third-party root."""
    if module in BASE:
        return "base"
    parts = module.split(".")
    if parts[0] == "raymm":
        return "raymm" if len(parts) == 1 else "raymm." + parts[1]
    return parts[0]


def allowed(package: str) -> set[str]:
    """What `package` may import, read from its `__init__.py` docstring."""
    path = REPO / package.replace(".", "/") / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    m = re.search(r"May import: ([^.]*)\.", doc)
    assert m, f"{path}: its docstring does not say what it may import ('May import: ...')"
    names = [n.strip() for n in m.group(1).split(",") if n.strip()]
    return {n if n in ("base", "actors", "policies") else f"raymm.{n}" for n in names}


def imports(path: Path, module: str, everything: bool = False) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of raymm/actors/policies
    and Ray (of any module with `everything`)."""
    out = []
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = module.split(".")[: len(module.split(".")) - child.level + is_pkg]
                    base = ".".join(parts + ([base] if base else []))
                for a in child.names:
                    full = f"{base}.{a.name}"
                    out.append((full if full in MODULES else base, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return [(m, line, f) for m, line, f in out
            if everything or m.split(".")[0] in ("raymm", "actors", "policies", "ray")]


MODULES = modules()


def test_every_import_follows_the_package_order():
    wrong = []
    for module, path in MODULES.items():
        pkg = package_of(module)
        if pkg == "raymm":
            continue  # the facade: lazy names of raymm.app and raymm.models
        may = {pkg} | (set() if pkg == "base" else allowed(pkg))
        for target, line, _ in imports(path, module):
            tpkg = package_of(target)
            if tpkg == "ray" and pkg == "actors":
                continue
            if tpkg == "raymm" and target == "raymm" and pkg == "raymm.app":
                continue  # `raymm.__version__`
            if tpkg not in may:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target} ({pkg} may "
                             f"import only {', '.join(sorted(may))})")
    assert not wrong, "\n".join(wrong)


def test_the_declared_order_has_no_cycle():
    """The `May import` lines themselves form an order: no package may reach itself."""
    graph = {p: allowed(p) - {"base"} for p in PACKAGES}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            p = todo.pop()
            assert p != start, f"{start} may import itself through {sorted(seen)}"
            if p not in seen:
                seen.add(p)
                todo += graph.get(p, set())


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def inside(module: str, package: str) -> bool:
    """Whether `module` is `package` or one of its submodules, by dotted parts (so
    `a.tide_closed_form` is not inside `a.tide`)."""
    return module.split(".")[:len(package.split("."))] == package.split(".")


def import_cycles(graph: dict[str, set[str]], packages: set[str]) -> list[list[str]]:
    """The import cycles of `graph` (module -> the modules it imports) that mean something.
    The one exemption: a package's `__init__` importing its own submodules. A group of modules
    importing each other is exempt only when it lies inside one package (of `packages`) and
    stops being a cycle without those `__init__` edges."""
    cycles = []
    for comp in strongly_connected(graph):
        root = comp[0]   # sorted: a package comes before its submodules
        if root in packages and all(inside(m, root) for m in comp):
            members = set(comp)
            rest = {m: {t for t in graph[m] & members
                        if not (m in packages and t != m and inside(t, m))} for m in comp}
            if not strongly_connected(rest):
                continue
        cycles.append(comp)
    return cycles


def test_no_import_cycle_between_modules():
    graph = {m: {t for t, _, _ in imports(p, m) if t in MODULES and t != m}
             for m, p in MODULES.items()}
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert not import_cycles(graph, packages)


def test_the_cycle_check_exempts_only_a_package_importing_its_submodules():
    pkg = {"p", "p.sub"}
    # the package imports a submodule that reads a name the package re-exports: exempt
    assert import_cycles({"p": {"p.a"}, "p.a": {"p"}}, pkg) == []
    assert import_cycles({"p": {"p.sub"}, "p.sub": {"p.sub.a"}, "p.sub.a": {"p"}}, pkg) == []
    # two siblings whose names share a prefix (a bare string prefix took this for the above)
    assert import_cycles({"p.tide": {"p.tide_closed_form"}, "p.tide_closed_form": {"p.tide"}},
                         pkg) == [["p.tide", "p.tide_closed_form"]]
    # siblings, a module outside the package, a name that only starts like the package
    assert import_cycles({"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.a", "p"}}, pkg) \
        == [["p", "p.a", "p.b"]]
    assert import_cycles({"p": {"p.a"}, "p.a": {"q"}, "q": {"p"}}, pkg) == [["p", "p.a", "q"]]
    assert import_cycles({"p": {"pq"}, "pq": {"p"}}, pkg) == [["p", "pq"]]


def says_why(lines: list[str], i: int) -> bool:
    """Whether line `i` (0-based), or the comment above its block of imports, gives a reason."""
    if DEFERRED.search(lines[i]):
        return True
    while i > 0 and IMPORT_LINE.match(lines[i - 1]) and not DEFERRED.search(lines[i - 1]):
        i -= 1
    return i > 0 and bool(DEFERRED.search(lines[i - 1]))


def test_function_level_imports_say_why_they_are_deferred():
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for target, line, in_function in imports(path, module, everything=True):
            if in_function and not says_why(lines, line - 1):
                silent.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not silent, "function-level imports without a reason:\n" + "\n".join(silent)


def test_the_reference_local_update_imports_no_fast_path():
    """The local update both paths run imports nothing of the training engine (the lock-step
    path injects what it steps differently), and only `raymm.training` reaches its private
    kernels, the one place a torch upgrade checks."""
    local = {t for t, _, _ in imports(MODULES["raymm.training.local_update"],
                                      "raymm.training.local_update")}
    assert not {t for t in local if inside(t, "raymm.training")}, local
    reach = [f"{m} imports {t}" for m, p in MODULES.items() if not inside(m, "raymm.training")
             for t, _, _ in imports(p, m) if inside(t, "raymm.training._kernels")]
    assert not reach, "\n".join(reach)


#: a use of an API torch does not promise to keep: underscored torch names, the functorch C
#: bindings, custom operators and their vmap rules, aten operators, module internals
PRIVATE_TORCH = re.compile(r"torch\._(?!_)|_C\._functorch|\b_ft\.|torch\.library\.|torch\.ops\."
                           r"|\._parameters\b|\._base\b")


def test_every_private_torch_api_is_on_the_upgrade_checklist():
    """Every module that uses one of torch's private APIs is named in
    raymm/training/_kernels/README.md, the list a torch upgrade checks."""
    readme = (REPO / "raymm/training/_kernels/README.md").read_text()
    kernels = REPO / "raymm/training/_kernels"
    used, missing = [], []
    for module, path in MODULES.items():
        code = [line.split("#")[0] for line in path.read_text().splitlines()]
        if any(PRIVATE_TORCH.search(line) for line in code):
            used.append(module)
            name = path.name if path.parent == kernels else str(path.relative_to(REPO))
            if f"`{name}`" not in readme and f"`{name} " not in readme:
                missing.append(module)
    assert "raymm.training._kernels.lockstep_adam" in used   # the check sees what is there
    assert not missing, f"private torch APIs used but not in the README: {missing}"


def test_the_checks_see_imports():
    """The walker finds what is there (so the tests above cannot pass by seeing nothing)."""
    ray_imports = imports(MODULES["actors.ray_executor"], "actors.ray_executor")
    assert any(t == "ray" for t, _, _ in ray_imports)
    assert package_of("raymm.device.host") == "raymm.device"
    assert "raymm.protocol" in allowed("raymm.device")
    assert "policies" in allowed("raymm.app") and "policies" not in allowed("raymm.server")
    assert len(MODULES) > 100

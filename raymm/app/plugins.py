"""Plugins: datasets, policies, presets and model factories that live outside raymm.

A plugin is a Python module whose import registers things by name, with the same calls raymm's
own modules use: `raymm.data.base.register_dataset`, the policy registries of
`raymm.protocol.registry` (`SELECTORS`, `AGGREGATORS`, `SCHEDULES`, `OBJECTIVES`),
`raymm.protocol.registry.register_preset` and `raymm.models.factory.register_model`. A scenario
then names what the plugin registered, as it names anything built in.

Two ways a plugin is loaded, and only these two:

- an installed distribution declares it as an entry point of the group `raymm.plugins`
  (`mylab = "mylab.fl"`; with `module:function`, the function is called after the import).
  Every raymm command and `raymm.run` load these; `RAYMM_NO_ENTRY_POINTS=1` turns that off;
- the user names the module: `raymm run --plugin mylab.fl` (also `validate`, `sweep`,
  `data list`, `plugins list`) or `raymm.run(..., plugins=["mylab.fl"])`.

Why this is safe: a scenario, a run directory and a checkpoint stay data. Nothing read from a
file makes raymm import a module: a resumed run whose record (`plugins.json`) lists a plugin
that is not loaded is refused with the flag to add, and a sweep's child processes get their
plugins from the parent process that loaded them. A plugin that raises while importing (or
replaces something registered before it) is one `PluginError` naming the plugin and the
exception (exit code 2 on the command line), and whatever it had registered is taken back.

On Ray, the plugin modules travel to the workers (`worker_code`, `actors.runtime_env`), so a
node that does not have them installed runs them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import site
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from raymm.config.schema import Scenario
from raymm.data.base import DATASETS
from raymm.errors import RaymmError, ResumeError
from raymm.io.atomic import atomic_output
from raymm.models.factory import MODELS
from raymm.protocol.registry import POLICY_SECTIONS, PRESETS, Registry, unregister_preset

ENTRY_POINT_GROUP = "raymm.plugins"
#: set to 1 to start without the installed distributions' plugins (tests, a broken install)
NO_ENTRY_POINTS = "RAYMM_NO_ENTRY_POINTS"
#: the run directory's record of the plugins a run was made with
RECORD = "plugins.json"
#: raymm's own top-level packages: never a plugin, never shipped
RAYMM_PACKAGES = ("raymm", "actors", "policies")
#: the kinds of thing a plugin registers, in the order they are listed
KINDS = ("dataset", *POLICY_SECTIONS, "preset", "model")
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

__all__ = ["ENTRY_POINT_GROUP", "Plugin", "PluginError", "load", "load_entry_points",
           "loaded", "origin", "worker_code"]


class PluginError(RaymmError):
    """A plugin could not be loaded: the message names it and what went wrong."""


@dataclass
class Plugin:
    """A loaded plugin: its module, how it came to be loaded, and what it registered."""

    module: str
    #: "named" (--plugin, `plugins=`), "entry point NAME (DIST VERSION)", or "imported" (a
    #: module the caller imported itself that provides a name a run uses)
    source: str
    #: kind ("dataset", "selection", ..., "preset", "model") -> names it registered
    provides: dict[str, list[str]] = field(default_factory=dict)

    @property
    def named(self) -> bool:
        return self.source == "named"


#: module name -> plugin, in load order
_LOADED: dict[str, Plugin] = {}
_entry_points_done = False
_builtins_done = False


# --------------------------------------------------------------------------- loading


def load(names: Iterable[str] = (), *, entry_points: bool | None = None) -> list[Plugin]:
    """Load the installed distributions' plugins (once per process; unless `entry_points` is
    False, or None and RAYMM_NO_ENTRY_POINTS is set), then the modules in `names`. Returns
    the plugins of `names`. Raises `PluginError`."""
    global _entry_points_done
    _register_builtins()
    if entry_points is None:
        entry_points = os.environ.get(NO_ENTRY_POINTS, "") in ("", "0")
    if entry_points and not _entry_points_done:
        _entry_points_done = True
        load_entry_points()
    return [load_module(name) for name in dict.fromkeys(names)]


def load_entry_points() -> list[Plugin]:
    """Import every module the group `raymm.plugins` names (calling `module:function` entry
    points after the import). A module loaded before is not loaded again."""
    _register_builtins()
    out = []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                     key=lambda e: (e.name, e.value)):
        dist = getattr(ep, "dist", None)
        source = f"entry point {ep.name}" + (f" ({dist.name} {dist.version})" if dist else "")
        module, _, attr = ep.value.partition(":")
        out.append(_load(module.strip(), source, attr.strip() or None))
    return out


def load_module(name: str, source: str = "named") -> Plugin:
    """Import the plugin module `name` (a dotted module name) and record what it registers."""
    if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
        hint = " (a file mylab/fl.py is the module mylab.fl)" if isinstance(name, str) and \
            name.endswith(".py") else ""
        raise PluginError(f"--plugin {name!r}: not a module name; give a dotted Python module "
                          f"name such as mylab.fl{hint}")
    return _load(name, source, None)


def _register_builtins() -> None:
    """raymm's own datasets, policies and presets register before any plugin, so that a
    plugin reusing one of their names is refused as the plugin's mistake."""
    global _builtins_done
    if not _builtins_done:
        # validation imports this module for its labels and leaves registering the policies
        # to its caller; loading a plugin is what needs them registered first
        import policies  # noqa: F401  (deferred: registered only when a plugin is loaded)

        _builtins_done = True


def _load(name: str, source: str, call: str | None) -> Plugin:
    if name in _LOADED:
        return _LOADED[name]
    if name in sys.modules:  # imported by the caller already: record what it provides
        plugin = Plugin(name, source, _provided_by_module(name))
        for kind, names in _run_guarded(name, source,
                                        lambda: _call(sys.modules[name], call)).items():
            plugin.provides[kind] = sorted({*plugin.provides.get(kind, ()), *names})
        _LOADED[name] = plugin
        return plugin
    if source == "named":
        _find_in_working_dir(name)
    plugin = Plugin(name, source)
    plugin.provides = _run_guarded(
        name, source, lambda: _call(importlib.import_module(name), call))
    _LOADED[name] = plugin
    return plugin


def _call(module: ModuleType, attr: str | None) -> None:
    if attr is not None:
        fn = getattr(module, attr)
        if callable(fn):
            fn()


def _find_in_working_dir(name: str) -> None:
    """A module the user names on the command line may sit in the folder they run raymm from
    (as with `python -m`); that folder is searched last, after everything installed."""
    top = name.partition(".")[0]
    if importlib.util.find_spec(top) is not None:
        return
    cwd = Path.cwd()
    if (cwd / top).is_dir() or (cwd / f"{top}.py").is_file():
        sys.path.append(str(cwd))
        importlib.invalidate_caches()


def _run_guarded(name: str, source: str, action: Any) -> dict[str, list[str]]:
    """Run `action` (the import) and return what it registered; on an exception, or when it
    replaced something registered before, take back what it registered (and the modules of
    its own package it imported) and raise `PluginError`."""
    before = _snapshot()
    modules = set(sys.modules)
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - any failure of the user's code is one message
        _roll_back(before, _snapshot())
        _forget_modules(name, modules)
        raise PluginError(_failure(name, source, exc)) from exc
    after = _snapshot()
    replaced = [f"{kind} {n!r}" for kind, table in before.items() for n, obj in table.items()
                if n in after[kind] and after[kind][n] is not obj]
    if replaced:
        _roll_back(before, after)
        _forget_modules(name, modules)
        raise PluginError(f"plugin {name!r} ({source}) replaced what was registered before it: "
                          f"{', '.join(replaced)}; register under other names")
    return {kind: sorted(set(after[kind]) - set(before[kind])) for kind in KINDS
            if set(after[kind]) - set(before[kind])}


def _failure(name: str, source: str, exc: Exception) -> str:
    # the plugin itself (or a package above it) is missing, not something it imports
    if isinstance(exc, ModuleNotFoundError) and exc.name is not None and \
            (name == exc.name or name.startswith(f"{exc.name}.")):
        return (f"plugin {name!r} ({source}): no module named {exc.name!r} on the Python path "
                "(install its distribution, add its folder to PYTHONPATH, or run raymm from "
                "the folder that holds it)")
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and not frames[-1].filename.startswith("<"):
        where = f" ({frames[-1].filename}, line {frames[-1].lineno})"
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}, line {exc.lineno})"
    text = str(exc).strip().splitlines()
    off = (f"; {NO_ENTRY_POINTS}=1 starts raymm without the installed distributions' plugins"
           if source.startswith("entry point") else "")
    return (f"plugin {name!r} ({source}) failed to import: {type(exc).__name__}"
            f"{': ' + text[0] if text else ''}{where}{off}")


def _tables() -> dict[str, Any]:
    return {"dataset": DATASETS, **POLICY_SECTIONS, "preset": PRESETS, "model": MODELS}


def _snapshot() -> dict[str, dict[str, Any]]:
    out = {}
    for kind, table in _tables().items():
        if isinstance(table, Registry):
            out[kind] = {n: table.get(n) for n in table.names()}
        else:
            out[kind] = dict(table)
    return out


def _roll_back(before: Mapping[str, Mapping[str, Any]],
               after: Mapping[str, Mapping[str, Any]]) -> None:
    """Undo every registration between the two snapshots."""
    for kind, table in _tables().items():
        for n in set(after[kind]) - set(before[kind]):
            _unregister(kind, table, n)
        for n, obj in before[kind].items():
            if after[kind].get(n) is not obj:
                if isinstance(table, Registry):
                    table.unregister(n)
                    table.register(n)(obj)
                else:
                    table[n] = obj


def _unregister(kind: str, table: Any, name: str) -> None:
    """Take one registered name back out of its table (a policy registry, the presets, or a
    plain mapping of datasets or model factories)."""
    if isinstance(table, Registry):
        table.unregister(name)
    elif kind == "preset":
        unregister_preset(name)
    else:
        table.pop(name, None)


def _forget_modules(name: str, before: set[str]) -> None:
    """Modules of the plugin's own package that the failed import left behind: imported again
    next time, they register again."""
    top = name.partition(".")[0]
    for mod in set(sys.modules) - before:
        if mod == top or mod.startswith(f"{top}."):
            del sys.modules[mod]


def _provided_by_module(name: str) -> dict[str, list[str]]:
    """What is registered by classes or functions of module `name` (or its submodules)."""
    out: dict[str, list[str]] = {}
    for kind, table in _snapshot().items():
        names = [n for n, obj in table.items() if _module_of(obj) is not None and
                 (_module_of(obj) == name or str(_module_of(obj)).startswith(f"{name}."))]
        if names:
            out[kind] = sorted(names)
    return out


def unload(name: str) -> None:
    """Take back what plugin `name` registered and forget it (for tests that load a plugin and
    must leave the registries as they found them)."""
    plugin = _LOADED.pop(name, None)
    if plugin is None:
        return
    tables = _tables()
    for kind, names in plugin.provides.items():
        for n in names:
            _unregister(kind, tables[kind], n)
    top = name.partition(".")[0]
    for mod in [m for m in sys.modules if m == top or m.startswith(f"{top}.")]:
        del sys.modules[mod]


# --------------------------------------------------------------------------- what is loaded


def loaded() -> list[Plugin]:
    """Every plugin loaded in this process, in load order."""
    return list(_LOADED.values())


def _module_of(obj: Any) -> str | None:
    """The module that defines a registered object (a class, a function, a loader instance)."""
    if isinstance(obj, dict):
        return None  # a preset: only its registration says where it came from
    mod = getattr(obj, "__module__", None)  # an instance answers with its class's module
    return mod if isinstance(mod, str) else None


def origin(kind: str, name: str) -> str | None:
    """The plugin module that registered `name` (a dataset, a policy of section `kind`, a
    preset, a model factory), or None for raymm's own."""
    for plugin in _LOADED.values():
        if name in plugin.provides.get(kind, ()):
            return plugin.module
    table = _tables()[kind]
    if isinstance(table, Registry):
        obj = table.get(name) if name in table else None
    else:
        obj = table.get(name)
    mod = _module_of(obj) if obj is not None else None
    if mod is None or mod.partition(".")[0] in RAYMM_PACKAGES:
        return None
    return mod


def labelled(kind: str, names: Iterable[str]) -> list[str]:
    """Names as choices in a message: a plugin's say which plugin registered them."""
    out = []
    for n in names:
        mod = origin(kind, n)
        out.append(n if mod is None else f"{n} (plugin {mod})")
    return out


def used_names(sc: Scenario) -> dict[str, str]:
    """kind -> the name the scenario uses of it."""
    used = {"dataset": sc.dataset_name, **{s: getattr(sc, s).name for s in POLICY_SECTIONS}}
    factory = getattr(sc.model, "factory", None)
    if isinstance(factory, str):
        used["model"] = factory
    if sc.method is not None:
        used["preset"] = sc.method
    return used


# --------------------------------------------------------------------------- workers


def worker_modules(sc: Scenario) -> list[str]:
    """The modules every Ray worker of this run imports before anything else: the plugins
    loaded here, and the modules outside raymm that define a name the scenario uses (a
    policy class the caller imported itself). `__main__` is left out: what a script defines
    itself travels by value."""
    out = [p.module for p in _LOADED.values()]
    for kind, name in used_names(sc).items():
        mod = origin(kind, name)
        if mod is not None and mod != "__main__":
            out.append(mod)
    return list(dict.fromkeys(out))


def worker_code(sc: Scenario) -> tuple[list[str], list[str]]:
    """(modules to import on every worker, local paths of their top-level packages or files
    for Ray's `py_modules`). A namespace package spread over several folders cannot travel;
    it must be installed on the nodes."""
    modules = worker_modules(sc)
    paths = []
    for top in dict.fromkeys(m.partition(".")[0] for m in modules):
        where = _top_path(top)
        if where is not None:
            paths.append(str(where))
    return modules, paths


def _top_path(top: str) -> Path | None:
    """The folder of package `top` (or its single file), when it is one of the user's: not
    raymm's own, not the standard library, not a namespace package."""
    if top in RAYMM_PACKAGES or top in sys.stdlib_module_names:
        return None
    mod = sys.modules.get(top)
    if mod is None:
        return None
    paths = list(getattr(mod, "__path__", []) or [])
    if paths:
        return Path(paths[0]) if len(paths) == 1 and getattr(mod, "__file__", None) else None
    file = getattr(mod, "__file__", None)
    return Path(file) if file else None


def search_paths(modules: Sequence[str]) -> list[str]:
    """Folders a child process needs on its Python path to import `modules` as this process
    did (site-packages folders are on it anyway)."""
    sites = {str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    out = []
    for top in dict.fromkeys(m.partition(".")[0] for m in modules):
        where = _top_path(top)
        if where is not None:
            parent = str(where.resolve().parent)
            if parent not in sites:
                out.append(parent)
    return list(dict.fromkeys(out))


def child_plugins(sc: Scenario) -> list[str]:
    """The plugins a fresh raymm process must load to run `sc` as this one would (the
    installed distributions' entry points load there by themselves)."""
    entry = {p.module for p in _LOADED.values() if p.source.startswith("entry point")}
    return [m for m in worker_modules(sc) if m not in entry]


# --------------------------------------------------------------------------- the run's record


def record(run_dir: Path, sc: Scenario) -> None:
    """Write `plugins.json` into a new run directory when the run uses plugins: which modules
    (and how each was loaded), so a resumed run or a sweep's re-run loads the same."""
    modules = worker_modules(sc)
    if not modules:
        return
    entries = [{"module": m, "source": _LOADED[m].source if m in _LOADED else "imported",
                "provides": _LOADED[m].provides if m in _LOADED else {}} for m in modules]
    with atomic_output(run_dir / RECORD) as f:
        f.write((json.dumps({"plugins": entries}, indent=1) + "\n").encode())


def recorded(run_dir: Path) -> list[str]:
    """The plugin modules a run directory's record lists (none without a record)."""
    path = run_dir / RECORD
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())["plugins"]
        return [str(e["module"]) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResumeError(f"--resume: {path} is unreadable: {exc}") from None


def check_recorded(run_dir: Path) -> None:
    """Refuse to resume a run whose plugins are not loaded: a run directory names them but
    never imports them itself; the user gives them again."""
    missing = [m for m in recorded(run_dir) if m not in _LOADED and m not in sys.modules]
    if missing:
        flags = " ".join(f"--plugin {m}" for m in missing)
        raise ResumeError(f"--resume: {run_dir} was run with the plugin(s) "
                          f"{', '.join(missing)}, which are not loaded; resume with "
                          f"`raymm run --resume {run_dir} {flags}` (or raymm.run(resume=..., "
                          f"plugins=[...])): a run directory never imports code by itself")

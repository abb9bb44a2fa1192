"""The scenarios that ship with raymm: where they are, `raymm scenarios list` and `copy`.

They are the scenarios a user runs or copies to start from; an experiment's configurations
(ablation rows, calibrations) live with the experiment in the repository's `experiments/`, and
the measurement tools' populations in `tools/`, neither shipped. In a source checkout they are
the repository's `scenarios/` folder; an installed wheel carries the same YAML files as package
data under `raymm/scenarios/` (pyproject.toml maps them there), so `pip install raymm` users can
list them and copy one to edit. A scenario is named by its path under that folder without
`.yaml`: `quickstart`, `bench/standard`, `reliability/quickstart_faults`.
"""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

from raymm.errors import RaymmError

#: the raymm package folder: an installed wheel has its scenarios in it, a checkout beside it
PACKAGE = Path(__file__).resolve().parents[1]


def scenario_root() -> Path:
    """The folder holding the shipped scenarios: `raymm/scenarios` in an installed wheel,
    else the checkout's `scenarios/` next to the `raymm` package."""
    packaged = PACKAGE / "scenarios"
    return packaged if packaged.is_dir() else PACKAGE.parent / "scenarios"


def scenario_names(root: Path | None = None) -> list[str]:
    """Every shipped scenario's name, sorted."""
    root = scenario_root() if root is None else root
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def describe(path: Path) -> str:
    """The first line of the scenario's leading comment ('' without one)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def find_scenario(name: str, root: Path | None = None) -> Path:
    """The file of scenario `name` (with or without `.yaml`); a RaymmError naming the closest
    shipped names when there is none."""
    root = scenario_root() if root is None else root
    names = scenario_names(root)
    key = name.removesuffix(".yaml")
    if key not in names:
        # a bare file name finds a scenario in a subfolder when only one has it
        matches = [n for n in names if n.rsplit("/", 1)[-1] == key]
        if len(matches) != 1:
            close = matches or difflib.get_close_matches(key, names, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else \
                "; `raymm scenarios list` shows them all"
            raise RaymmError(f"scenarios: no shipped scenario {name!r}{hint}")
        key = matches[0]
    return root / f"{key}.yaml"


def copy_scenario(name: str, dest: str | Path = ".", force: bool = False,
                  root: Path | None = None) -> Path:
    """Copy scenario `name` to `dest` (a folder: the scenario's file name in it; else the file
    to write) and return the path written. An existing file is kept unless `force`."""
    src = find_scenario(name, root)
    out = Path(dest).expanduser()
    if out.is_dir():
        out = out / src.name
    if out.exists() and not force:
        raise RaymmError(f"scenarios copy: {out} exists (--force replaces it)")
    if not out.parent.is_dir():
        raise RaymmError(f"scenarios copy: folder {out.parent} does not exist")
    shutil.copyfile(src, out)
    return out


def listing(root: Path | None = None) -> str:
    """`raymm scenarios list`: one line per scenario, its name and its description."""
    root = scenario_root() if root is None else root
    names = scenario_names(root)
    width = max((len(n) for n in names), default=0)
    lines = [f"{n:<{width}}  {describe(root / f'{n}.yaml')}".rstrip() for n in names]
    lines.append(f"({len(names)} scenarios in {root}; `raymm scenarios copy NAME [DEST]` copies "
                 "one to edit)")
    return "\n".join(lines)

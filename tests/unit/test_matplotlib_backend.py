"""Nothing raymm imports or draws changes the caller's matplotlib backend or loads pyplot: a
notebook keeps its inline backend after `import raymm`, a run, or a comparison plot."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

CHECK = r"""
import importlib, pkgutil, sys
import matplotlib
from matplotlib import rcsetup

import actors, policies, raymm

def unpicked():
    # no backend chosen yet (matplotlib decides on first use): the caller's choice is still open
    return dict.__getitem__(matplotlib.rcParams, "backend") is rcsetup._auto_backend_sentinel

assert unpicked()
names = []
for pkg in (raymm, actors, policies):
    for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(mod.name)
        names.append(mod.name)
assert "raymm.driver.pictures" in names and len(names) > 60, names
assert "matplotlib.pyplot" not in sys.modules, "imported: pyplot"
assert unpicked(), "a raymm import picked a backend"

# draw: a run with TensorBoard pictures, then the comparison plot
sys.path.insert(0, "tests")
from helpers import tiny_scenario
from raymm.app.api import run
from raymm.results.tables import compare, write_comparison

def draw(out):
    res = run(tiny_scenario(rounds=2, **{"output.tensorboard": True}), out=out)
    write_comparison(compare([res.run_dir]), out + "/cmp")

draw(sys.argv[1] + "/a")
assert "matplotlib.pyplot" not in sys.modules, "drawing imported pyplot"
assert unpicked(), "drawing picked a backend"

# a caller that chose a backend keeps it
matplotlib.use("svg")
draw(sys.argv[1] + "/b")
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert "matplotlib.pyplot" not in sys.modules
print("ok", len(names))
"""


def test_raymm_leaves_the_matplotlib_backend_alone(tmp_path):
    env_free = {k: v for k, v in __import__("os").environ.items() if k != "MPLBACKEND"}
    out = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)], cwd=REPO, env=env_free,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ok ")

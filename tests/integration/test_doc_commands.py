"""Every command the README and docs/ show in a ```bash block, run, so the docs cannot go stale.

Each `raymm ...` command runs as written (as `python -m raymm.app.cli`, in a process of its
own forked from one that has imported raymm, torch and Ray: `forked_cli`), with small
settings: the serial executor, one round (`--set rounds=1`), the first seed only, one job, tiny
benchmark sizes, and its output in a temporary working directory (where `scenarios/` is the
repository's). Relative output folders stay as written, so a `raymm compare` of a folder an
earlier `raymm sweep` wrote reads it, as a reader would. A `python experiments/...`,
`tools/...` or `examples/...` script is not run (each has tests of its own and takes minutes);
its `--help` must list every flag the docs give it.

What cannot run here is skipped with one of the reasons in `REASONS`, listed by the test
(`-rA` or `-s` shows the list): a cluster, the full datasets when `$RAYMM_DATA` lacks them
(a failure instead under RAYMM_REQUIRE_DATA=1, as CI sets), a download, an install. The test
fails if it ran no command at all.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from forked_cli import ForkedCli

from helpers import REPO

pytestmark = pytest.mark.slow

#: the only reasons a command may be skipped for
REASONS = {
    "cluster": "needs a Ray cluster (docs/cluster.md); tests/integration/test_ray_up.py covers it",
    "install": "installs or builds the environment (make, pip, venv): what ran this test",
    "data": "needs a full dataset that $RAYMM_DATA does not hold",
    "release": "converts a dataset release you download yourself (docs/data.md)",
    "network": "downloads from the internet",
    "viewer": "opens a viewer (TensorBoard)",
    "depends": "reads what a command skipped above would have written",
}
#: a raymm subcommand's flag -> the small value it runs with here
SMALL = {"--seeds": None, "--jobs": "1", "--executor": "serial", "--sizes": "200:20",
         "--rounds": "2", "--repeat": "2"}
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def doc_files() -> list[Path]:
    """The README and the reference docs; not the dated log kept verbatim under docs/ (its
    folder `log`), whose commands are a record of what ran then, not instructions."""
    return [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md")
                                        if "log" not in p.relative_to(REPO / "docs").parts)]


def doc_commands() -> list[tuple[str, str]]:
    """(file:line, command) for every command in a ```bash block: continuation lines joined,
    comments dropped."""
    out = []
    for path in doc_files():
        text = path.read_text()
        for block in BLOCK.finditer(text):
            first = text[:block.start(1)].count("\n") + 1
            pending, start = "", 0
            for n, line in enumerate(block.group(1).splitlines()):
                if not pending:
                    start = first + n
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                words = shlex.split(pending + line, comments=True)
                pending = ""
                if words:
                    out.append((f"{path.relative_to(REPO)}:{start}", shlex.join(words)))
    return out


@dataclass
class Plan:
    """What the test does with one documented command."""

    where: str
    command: str
    argv: list[str] = field(default_factory=list)   # a raymm command to run
    script: list[str] = field(default_factory=list)  # a script whose --help is checked
    skip: str = ""                                   # a key of REASONS
    detail: str = ""
    export: dict[str, str] = field(default_factory=dict)  # `export VAR=value`


def strip_env(words: list[str]) -> list[str]:
    """`VAR=value cmd ...` -> `cmd ...`."""
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    return words


def plan(where: str, command: str) -> Plan:
    words = strip_env(shlex.split(command))
    p = Plan(where, command)
    tool = words[0]
    if tool == "export":   # for the commands after it in the same file, as in a shell
        p.export = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        return p
    if tool == "ray" and "--" in words and words[words.index("--") + 1:][:1] == ["raymm"]:
        # `ray job submit ... -- raymm run ...`: the cluster part is skipped, the raymm part
        # runs here
        words = words[words.index("--") + 1:]
        tool = "raymm"
    if tool == "raymm":
        return small_raymm(p, words[1:])
    if tool in ("ray",):
        p.skip = "cluster"
    elif tool in ("make", "pip", "python3") or "pip" in words[:4] or "venv" in words[:4]:
        p.skip = "install"
    elif tool in ("chmod",):
        p.skip = "cluster"
    elif tool == "tensorboard":
        p.skip = "viewer"
    elif tool in ("python", sys.executable) and words[1].endswith(".py"):
        p.script = words[1:]
    else:
        raise AssertionError(f"{where}: no rule for this command; teach test_doc_commands.py "
                             f"how to run or why to skip it: {command}")
    return p


def small_raymm(p: Plan, args: list[str]) -> Plan:
    sub = args[0] if args else ""
    if sub == "data" and args[1:2] == ["download"]:
        p.skip = "network"
        return p
    if sub == "data" and args[1:2] == ["prepare"]:
        if "--from" not in args:   # reads what `raymm data download` put under $RAYMM_DATA
            p.skip, p.detail = "depends", "the release `raymm data download` fetches"
            return p
        source = args[args.index("--from") + 1]
        if not Path(os.path.expanduser(source)).exists():
            p.skip, p.detail = "release", f"{source} is not on this machine"
            return p
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in SMALL and sub in ("run", "sweep", "bench"):
            values = []
            while i + 1 < len(args) and not args[i + 1].startswith("--"):
                values.append(args[i + 1])
                i += 1
            if a == "--seeds":
                out += [a, values[0]] if values else [a]
            elif a == "--rounds" and sub != "bench":
                out += [a, *values]
            else:
                out += [a, SMALL[a]]
        elif a == "--out" and sub in ("run", "sweep", "bench", "compare"):
            dest = args[i + 1]
            out += [a, dest.lstrip("/") if dest.startswith("/") else dest]  # /tmp/x -> tmp/x
            i += 1
        elif "*" in a:
            out += sorted(os.path.relpath(f, REPO) for f in glob.glob(str(REPO / a)))
        else:
            out.append(a)
        i += 1
    if sub in ("run", "sweep"):
        if "--executor" not in out:
            out += ["--executor", "serial"]
        out += ["--set", "output.tensorboard=false"]
    if sub == "bench":
        for flag, value in (("--sizes", "200:20"), ("--rounds", "2"), ("--executor", "serial")):
            if flag not in out:
                out += [flag, value]
    p.argv = out
    missing = missing_data(out)
    if missing:
        # a dataset converted from a release the user downloads under its own licence
        # (`raymm data prepare crema-d --from ...`) is never on a CI machine: not "data"
        released = all(kind == "release" for kind, _ in missing)
        p.skip = "release" if released else "data"
        p.detail = ", ".join(path for _, path in missing)
    elif sub in ("run", "sweep"):
        p.argv += ["--set", f"rounds={fewest_rounds(out)}"]
    return p


def fewest_rounds(argv: list[str]) -> int:
    """The fewest rounds every scenario in `argv` accepts with its `--set` overrides, under
    each method of `--methods` (a modality chain needs a round per phase, Harmony one per
    stage); with `--methods all`, the fewest at which the fewest methods are left out."""
    from raymm.app.build import load_scenario
    from raymm.app.variants import method_scenarios
    from raymm.errors import ScenarioError

    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    scenarios = [a for a in argv if a.endswith((".yaml", ".yml"))]
    methods: list[str] = []
    if "--methods" in argv:
        for a in argv[argv.index("--methods") + 1:]:
            if a.startswith("--"):
                break
            methods.append(a)
    best: tuple[int, int] | None = None   # (methods left out, rounds)
    for rounds in (1, 2, 3, 4, 6, 10, 20):
        given = [*overrides, f"rounds={rounds}"]
        try:
            left_out = 0
            for sc in scenarios:
                if methods:
                    left_out += len(method_scenarios(str(REPO / sc), methods, given)[1])
                else:
                    load_scenario(str(REPO / sc), given)
        except ScenarioError:
            continue
        if best is None or left_out < best[0]:
            best = (left_out, rounds)
        if left_out == 0:
            break
    # none valid: the command itself then fails with the scenario's message
    return best[1] if best else 1


def missing_data(argv: list[str]) -> list[tuple[str, str]]:
    """(kind, path) of the data files the scenarios named in `argv` read and this machine
    lacks: kind "release" for a file converted from a dataset release the user downloads
    themselves (a `ReleaseLoader`: crema_d, ave, cmu_mosei), "data" for the others."""
    from raymm.data import DATASETS
    from raymm.data.releases.generic import ReleaseLoader

    missing = []
    for a in argv:
        if not a.endswith((".yaml", ".yml")) or not (REPO / a).is_file():
            continue
        spec = (yaml.safe_load((REPO / a).read_text()) or {}).get("dataset") or {}
        loader = DATASETS.get(spec.get("name", "synthetic"))
        if loader is None:   # a plugin's dataset: the command itself says what it lacks
            continue
        params = loader.Params(**{k: v for k, v in spec.items() if k != "name"})
        kind = "release" if isinstance(loader, ReleaseLoader) else "data"
        missing += [(kind, str(f)) for f in loader.required_files(params) if not f.exists()]
    return list(dict.fromkeys(missing))


def test_every_plan_is_known():
    """Every documented command has a rule (run, check or a listed reason) — cheap, always."""
    plans = [plan(w, c) for w, c in doc_commands()]
    assert plans, "no ```bash blocks found in README.md and docs/"
    assert all(p.skip in REASONS for p in plans if p.skip)
    assert any(p.argv for p in plans)


#: what the commands read from the repository, linked into their working directory
READ = ("scenarios", "experiments", "tools", "results", "examples", "cluster.yaml",
        "cluster-local.yaml")


def inputs(argv: list[str]) -> list[str]:
    """The run folders a `raymm compare` reads: its positional arguments."""
    out, skip_next = [], False
    for a in argv[1:]:
        if skip_next:
            skip_next = False
        elif a.startswith("--"):
            skip_next = "=" not in a
        else:
            out.append(a)
    return out


def run_raymm(cli: ForkedCli, argv: list[str], cwd: Path, exported: dict[str, str]
              ) -> subprocess.CompletedProcess[str]:
    """`python -m raymm.app.cli ARGV` in `cwd`, in a process of its own forked from one that
    has imported raymm, torch and Ray (`forked_cli`: the imports were half this test's time)."""
    env = {**os.environ, **exported, "RAYMM_NO_PROGRESS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [exported.get("PYTHONPATH")])])
    return cli.run(argv, cwd, env, timeout=900)


HELP: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}


def help_of(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    if argv not in HELP:
        HELP[argv] = subprocess.run([sys.executable, *argv, "--help"], cwd=REPO,
                                    env={**os.environ, "PYTHONPATH": str(REPO)},
                                    capture_output=True, text=True, timeout=300)
    return HELP[argv]


def check_script(script: list[str]) -> str:
    """'' when `python SCRIPT --help` (and `SCRIPT SUBCOMMAND --help`) lists every flag the
    docs give the script, else what is wrong."""
    path = REPO / script[0]
    if not path.is_file():
        return f"{script[0]} does not exist"
    helps = [(str(path),)]
    if len(script) > 1 and re.fullmatch(r"[a-z_]+", script[1]):   # a subcommand
        helps.append((str(path), script[1]))
    text = ""
    for h in helps:
        res = help_of(h)
        if res.returncode != 0:
            return f"{' '.join(h)} --help failed: {res.stderr[-500:]}"
        text += res.stdout
    for word in script[1:]:
        if word.endswith((".yaml", ".yml")) and not glob.glob(str(REPO / word)):
            return f"{word} does not exist"
    unknown = [w for w in script[1:] if w.startswith("--") and w.split("=")[0] not in text]
    return f"flags not in its --help: {unknown}" if unknown else ""


def test_documented_commands_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in READ:   # read by the commands, never written
        if (REPO / name).exists():
            (work / name).symlink_to(REPO / name)
    plans = [plan(w, c) for w, c in doc_commands()]
    ran, checked, skipped, failures = [], [], [], []
    require_data = os.environ.get("RAYMM_REQUIRE_DATA", "") not in ("", "0")
    done: set[tuple[str, ...]] = set()
    exported: dict[str, str] = {}
    cli = ForkedCli({**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for i, p in enumerate(plans):
            if i and p.where.split(":")[0] != plans[i - 1].where.split(":")[0]:
                exported = {}   # a shell per file
            if p.export:
                exported.update(p.export)
                continue
            if not p.skip and p.argv[:1] == ["compare"] and (
                    lost := [a for a in inputs(p.argv) if not (work / a).exists()]):
                p.skip, p.detail = "depends", ", ".join(lost)
            if p.skip == "data" and require_data:
                failures.append(f"{p.where}: {p.command}: data missing under "
                                f"RAYMM_REQUIRE_DATA=1: {p.detail}")
            elif p.skip:
                skipped.append(f"{p.where}: {p.command}  [{REASONS[p.skip]}"
                               f"{': ' + p.detail if p.detail else ''}]")
            elif p.script:
                problem = check_script(p.script)
                checked.append(f"{p.where}: {p.command}")
                if problem:
                    failures.append(f"{p.where}: {p.command}: {problem}")
            elif (key := (*p.argv, *sorted(exported.items()))) in done:   # shown twice
                ran.append(f"{p.where}: raymm {shlex.join(p.argv)} (ran above)")
            else:
                done.add(key)
                t0 = time.perf_counter()
                res = run_raymm(cli, p.argv, work, exported)
                ran.append(f"{p.where}: raymm {shlex.join(p.argv)}  "
                           f"({time.perf_counter() - t0:.0f} s)")
                if res.returncode != 0:
                    failures.append(f"{p.where}: raymm {shlex.join(p.argv)} exited "
                                    f"{res.returncode}:\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
    finally:
        cli.close()
    report = ["ran:", *ran, "", "scripts checked (--help lists their flags):", *checked, "",
              "skipped:", *skipped]
    print("\n".join(report))
    assert ran, "no documented raymm command ran"
    assert not failures, "\n\n".join(failures) + "\n\n" + "\n".join(report)

"""`raymm` command line: one subcommand per task around a scenario (running, checking,
sweeping and comparing it, its data, the benchmark).

Every user mistake (a bad scenario, a missing data file) prints one message and exits with
code 2, before any run directory is created.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from raymm import __version__
from raymm.app.data_cli import add_data_parser, run_data
from raymm.errors import Interrupted, RaymmError
from raymm.io.paths import os_error_text

EXIT_FAILED = 1  # a sweep finished, but some of its runs failed
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value, e.g. --set rounds=3 (repeatable)")
    add_plugin_arg(p)


def add_plugin_arg(p: argparse.ArgumentParser) -> None:
    """`--plugin MODULE` (repeatable): see `raymm.app.plugins`."""
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                   help="import this Python module first: the datasets, policies, presets and "
                        "model factories it registers become names a scenario can use "
                        "(repeatable; installed distributions' raymm.plugins entry points "
                        "load by themselves unless RAYMM_NO_ENTRY_POINTS=1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raymm")
    parser.add_argument("--version", action="version", version=f"raymm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario and write a run directory")
    run.add_argument("scenario", nargs="?", default=None,
                     help="scenario YAML file (optional with --resume)")
    run.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="KEY=VALUE",
                     help="override a scenario value, e.g. --set rounds=3 (repeatable)")
    run.add_argument("--resume", metavar="RUN_DIR", default=None,
                     help="continue a run directory from its newest checkpoint")
    run.add_argument("--out", default=None, help="parent folder of the run directory "
                                                 "(default: the scenario's output.dir)")
    run.add_argument("--executor", choices=["serial", "ray"], default=None,
                     help="where devices train (default: the scenario's execution.executor)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--export", action="append", default=[], choices=["csv"],
                     help="also write the rounds as rounds.csv beside rounds.parquet "
                          "(repeatable as more formats come)")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="show Ray's own log lines and warnings on stderr")
    add_plugin_arg(run)
    val = sub.add_parser("validate", help="check a scenario without running it")
    _add_scenario_args(val)
    add_data_parser(sub)
    _add_scenarios_parser(sub)
    sw = sub.add_parser(
        "sweep", help="run scenarios over seeds and write a comparison table",
        description="Run scenarios over seeds and write a comparison table. Each run gets "
                    "the directory runs/<scenario name>-seed<seed> under --out; running the "
                    "same command again skips finished runs, continues interrupted ones from "
                    "their newest checkpoint (output.checkpoint_every, or Ctrl-C) and refuses a "
                    "directory that holds a run of another configuration. A run that fails "
                    "does not stop the others; the sweep then exits with code 1.")
    sw.add_argument("scenarios", nargs="+", help="scenario YAML files")
    sw.add_argument("--seeds", type=int, nargs="*", default=[],
                    help="seeds to run each scenario with (default: each scenario's own)")
    sw.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override applied to every scenario (repeatable)")
    sw.add_argument("--out", default="sweeps", help="folder for runs/ and comparison.{parquet,md}")
    sw.add_argument("--executor", choices=["serial", "ray"], default=None)
    sw.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="run up to N runs at once, each in its own process with "
                         "max(1, cores // N) OpenMP/BLAS threads (and as many CPUs for an "
                         "embedded Ray); its output goes to runs/<run>.log (default: 1, one "
                         "after the other in this process; on a cluster, as many as it holds)")
    sw.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="sweep a scenario key over these values (repeatable: the sweep runs "
                         "the product, with the methods and seeds); each run is named "
                         "<scenario>_<key><value>... (raymm.app.grid)")
    sw.add_argument("--address", default=None, metavar="HOST:PORT",
                    help="run the sweep on this Ray cluster ('auto': RAY_ADDRESS; inside "
                         "`ray job submit` the cluster is used without it): each run's driver "
                         "is a Ray actor on a node with room for it and its DeviceActors, "
                         "and its files come back under --out (docs/cluster.md)")
    sw.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                    help="run each scenario under these methods (preset names), or 'all' for "
                         "every named method that can run on it; same data, rounds, protocol "
                         "and sync period (raymm.app.variants), runs named <scenario>_<method>")
    _add_budget_args(sw)
    add_plugin_arg(sw)
    plug = sub.add_parser("plugins", help="the plugins loaded and what each registers")
    plug_sub = plug.add_subparsers(dest="plugins_command")
    add_plugin_arg(plug_sub.add_parser(
        "list", help="installed distributions' plugins and --plugin modules: their datasets, "
                     "policies, presets and model factories with their parameters"))
    cmp = sub.add_parser("compare", help="compare finished runs: one table and an "
                                          "accuracy-vs-GiB plot")
    cmp.add_argument("run_dirs", nargs="+",
                     help="run directories, or folders of run directories (a sweep's runs/)")
    cmp.add_argument("--out", default="comparison",
                     help="folder for comparison.{parquet,md} and accuracy_vs_gib.png")
    cmp.add_argument("--time-axis", action="store_true",
                     help="also accuracy against simulated hours (accuracy_vs_sim_hours.png; "
                          "docs/time.md)")
    _add_budget_args(cmp)
    # deferred: `raymm --help`, `validate` and `data` start without importing torch or Ray
    from raymm.app import bench

    bench.build_parser(sub.add_parser(
        "bench", help="the standard workload on raymm next to the bare loop (steady s/round)",
        description=bench.__doc__.split("\n")[0]))
    # said from the subcommands themselves, so it stays true as they change
    parser.description = ("Simulate multimodal federated learning on heterogeneous IoT devices. "
                          f"Subcommands: {', '.join(sub.choices)}; `raymm SUBCOMMAND --help` "
                          "for each.")
    return parser


def _add_scenarios_parser(sub: argparse._SubParsersAction) -> None:
    sc = sub.add_parser("scenarios", help="list the scenarios that ship with raymm, or copy one "
                                          "to edit")
    what = sc.add_subparsers(dest="scenarios_command", required=True)
    what.add_parser("list", help="every shipped scenario with its description")
    cp = what.add_parser("copy", help="copy a shipped scenario to edit and run it")
    cp.add_argument("name", help="scenario name as `raymm scenarios list` shows it "
                                 "(e.g. quickstart, bench/standard)")
    cp.add_argument("dest", nargs="?", default=".",
                    help="folder or file to write (default: the current folder)")
    cp.add_argument("--force", action="store_true", help="replace an existing file")


def _scenarios(args: argparse.Namespace) -> int:
    # deferred: only this subcommand needs it (kept out of every other command's start-up)
    from raymm.app import scenarios

    if args.scenarios_command == "list":
        print(scenarios.listing())
    else:
        out = scenarios.copy_scenario(args.name, args.dest, force=args.force)
        print(f"wrote {out}; run it with: raymm run {out}")
    return 0


def _add_budget_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget-gib", type=float, default=None, help="budget B for Acc@B (GiB)")
    g.add_argument("--budget-from", default=None, metavar="SCENARIO_NAME",
                   help="B = mean total traffic of this scenario's runs (the paper's choice)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "validate":
            return _validate(args)
        if args.command == "data":
            return run_data(args)
        if args.command == "scenarios":
            return _scenarios(args)
        if args.command == "plugins":
            return _plugins(args)
        if args.command in ("sweep", "compare"):
            return _sweep(args)
        if args.command == "bench":
            # deferred: `raymm --help`, `validate` and `data` start without importing torch or Ray
            from raymm.app import bench

            bench.main(args)
            return 0
        return _run(args)
    except Interrupted as exc:
        print(f"raymm: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RaymmError as exc:
        print(f"raymm: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a path that cannot be read or written: the user's to fix

        print(f"raymm: {terminal_safe(os_error_text(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except RecursionError:
        print("raymm: input nested too deeply to read", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError:
        print("raymm: out of memory: the scenario asks for more than this machine has "
              "(fewer devices, samples or a smaller model)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("raymm: aborted", file=sys.stderr)
        return EXIT_INTERRUPTED


def terminal_safe(text: str) -> str:
    """Messages quote what the user wrote (a key, a name, a path); control characters in it
    (terminal colour codes, NUL, a carriage return) are shown escaped, never sent to the
    terminal. Line breaks of the message itself stay."""
    return "\n".join("".join(c if c.isprintable() else ascii(c)[1:-1] for c in line)
                     for line in text.split("\n"))


def _validate(args: argparse.Namespace) -> int:
    # deferred: `raymm --help`, `validate` and `data` start without importing torch or Ray
    from raymm.app import plugins
    from raymm.app.build import load_scenario

    plugins.load(args.plugins)
    sc = load_scenario(args.scenario, args.overrides)
    print(f"{args.scenario}: valid scenario {sc.name!r} (method={sc.method}, "
          f"{sc.population.devices} devices, {sc.rounds} rounds, dataset {sc.dataset_name})")
    return 0


def _run(args: argparse.Namespace) -> int:
    # deferred: `raymm --help`, `validate` and `data` start without importing torch or Ray
    from raymm.app.api import run

    if args.verbose:  # read where Ray starts (actors.ray_executor.ensure_ray)
        os.environ["RAYMM_VERBOSE"] = "1"
    if args.scenario is None and args.resume is None:
        raise RaymmError("run: give a scenario file, or --resume RUN_DIR")
    result = run(args.scenario, args.overrides, out=args.out, executor=args.executor,
                 progress=not args.no_progress and not os.environ.get("RAYMM_NO_PROGRESS"),
                 resume=args.resume, export=args.export, plugins=args.plugins)
    s = result.summary
    acc = s["final_accuracy"]
    print(f"{s['name']}: {s['rounds_completed']} rounds, final accuracy "
          f"{acc if acc is None else f'{acc:.4f}'}, best {s['best_accuracy']:.4f}, "
          f"{s['gib_total'] * 1024:.2f} MiB traffic, {s['wall_seconds']:.1f} s wall")
    print(f"run directory: {result.run_dir}")
    return 0


def _plugins(args: argparse.Namespace) -> int:
    # deferred: `raymm --help`, `validate` and `data` start without importing torch or Ray
    from raymm.app import plugins
    from raymm.app.schema_doc import plugins_text

    plugins.load(getattr(args, "plugins", []))
    print(plugins_text())
    return 0


def _sweep(args: argparse.Namespace) -> int:
    # deferred: `raymm --help`, `validate` and `data` start without importing torch or Ray
    from raymm.app.sweep import run_sweep
    from raymm.results.tables import compare, write_comparison

    if args.command == "sweep":
        comp = run_sweep(args.scenarios, args.seeds, args.overrides, args.out, args.executor,
                         args.budget_gib, args.budget_from,
                         progress=not os.environ.get("RAYMM_NO_PROGRESS"),
                         methods=args.methods, jobs=args.jobs, plugins=args.plugins,
                         grid=args.grid, address=args.address)
        if comp.runs:
            print(f"comparison written to {args.out}/comparison.{{parquet,md}}")
    else:
        # deferred: `raymm --help`, `validate` and `data` start without importing torch or Ray
        from raymm.results.compare import find_runs

        comp = compare(find_runs(args.run_dirs), args.budget_gib, args.budget_from)
        write_comparison(comp, args.out)
        print(f"comparison written to {args.out}/comparison.{{parquet,md}} and "
              f"{args.out}/accuracy_vs_gib.png")
        if args.time_axis:
            # deferred: `raymm --help`, `validate` and `data` start without importing torch
            from raymm.results.compare import plot_runs_time

            png = plot_runs_time(find_runs(args.run_dirs),
                                 os.path.join(args.out, "accuracy_vs_sim_hours.png"))
            print(f"accuracy against simulated hours: {png}")
    print(comp.markdown, end="")
    if comp.failed:
        print("raymm sweep: not every run finished:", file=sys.stderr)
        for line in comp.failed:
            print(f"  - {terminal_safe(line)}", file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())

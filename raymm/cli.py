"""`raymm` command line: run and validate scenarios.

Every user mistake (a bad scenario, a missing data file) prints one message and exits with
code 2, before any run directory is created.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from raymm.errors import RaymmError

EXIT_USAGE = 2


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value, e.g. --set rounds=3 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raymm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario and write a run directory")
    _add_scenario_args(run)
    run.add_argument("--out", default=None, help="parent folder of the run directory "
                                                 "(default: the scenario's output.dir)")
    run.add_argument("--executor", choices=["serial", "ray"], default=None,
                     help="where devices train (default: the scenario's execution.executor)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    val = sub.add_parser("validate", help="check a scenario without running it")
    _add_scenario_args(val)
    from raymm import bench

    bench.build_parser(sub.add_parser(
        "bench", help="the standard workload on raymm next to the bare loop (steady s/round)",
        description=bench.__doc__.split("\n")[0]))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "validate":
            return _validate(args)
        if args.command == "bench":
            from raymm import bench

            bench.main(args)
            return 0
        return _run(args)
    except RaymmError as exc:
        print(f"raymm: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("raymm: interrupted", file=sys.stderr)
        return 130


def _validate(args: argparse.Namespace) -> int:
    from raymm.api import load_scenario

    sc = load_scenario(args.scenario, args.overrides)
    print(f"{args.scenario}: valid scenario {sc.name!r} (method={sc.method}, "
          f"{sc.population.devices} devices, {sc.rounds} rounds, dataset {sc.dataset_name})")
    return 0


def _run(args: argparse.Namespace) -> int:
    from raymm.api import run

    result = run(args.scenario, args.overrides, out=args.out, executor=args.executor,
                 progress=not args.no_progress and not os.environ.get("RAYMM_NO_PROGRESS"))
    s = result.summary
    acc = s["final_accuracy"]
    print(f"{s['name']}: {s['rounds_completed']} rounds, final accuracy "
          f"{acc if acc is None else f'{acc:.4f}'}, best {s['best_accuracy']:.4f}, "
          f"{s['gib_total'] * 1024:.2f} MiB traffic, {s['wall_seconds']:.1f} s wall")
    print(f"run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

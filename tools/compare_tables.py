"""Two method tables of `experiments/fedmchain/fedmchain_table.py` (their `table.json`), side
by side.

    python tools/compare_tables.py results/fedmchain_avdigits_imbalanced/table.json \
        results/fedmchain_avdigits_imbalanced_lockstep/table.json --labels sequential lock-step

prints, per method and column, each table's mean ± std over seeds and the difference of the
means, marked `*` where it exceeds both tables' standard deviations (outside the seeds' spread),
then each table's ranking by the first column and the summed wall seconds of its runs. Made to
check that another code path (the lock-step one) reproduces a table made on the sequential
path, as issue 34 asks of a change that moves the last bits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: the columns compared (those of the table that are accuracies, in %, and Acc@B)
COLUMNS = ["ACC", "ACC_m", "audio only", "visual only", "MIR", "Acc@B"]


def _cell(stat: list[float], scale: float, digits: int) -> str:
    return f"{stat[0] * scale:.{digits}f} ± {stat[1] * scale:.{digits}f}"


def compare(a: dict[str, Any], b: dict[str, Any], labels: tuple[str, str]) -> str:
    cols = [c for c in COLUMNS if all(c in a["rows"][m] for m in a["rows"])]
    lines = [f"| method | column | {labels[0]} | {labels[1]} | difference |",
             "|---|---|---|---|---|"]
    for method in a["rows"]:
        if method not in b["rows"]:
            continue
        for col in cols:
            sa, sb = a["rows"][method][col], b["rows"][method][col]
            scale, digits = (1.0, 2) if col == "MIR" else (100.0, 1)
            diff = (sb[0] - sa[0]) * scale
            outside = abs(diff) > max(sa[1], sb[1]) * scale
            lines.append(f"| {method} | {col} | {_cell(sa, scale, digits)} | "
                         f"{_cell(sb, scale, digits)} | {diff:+.{digits}f}"
                         f"{' *' if outside else ''} |")
    for label, t in zip(labels, (a, b)):
        order = sorted(t["rows"], key=lambda m: -t["rows"][m][cols[0]][0])
        wall = sum(r["wall_seconds"] for runs in t["runs"].values() for r in runs)
        lines.append("")
        lines.append(f"{label}: by {cols[0]}, {' > '.join(order)}; runs' wall time "
                     f"{wall / 60:.1f} min")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--labels", nargs=2, default=["a", "b"])
    args = ap.parse_args(argv)
    tables = [json.loads(p.read_text()) for p in (args.a, args.b)]
    print(compare(tables[0], tables[1], (args.labels[0], args.labels[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The SSCA table of the clustered benchmark (docs/methods/fedmchain.md, "SSCA where groups
exist"), from finished runs: one row per setting, mean ± std over seeds of the final ACC, each
group's final ACC, the adjusted Rand index per sync (`ssca/ari`), churn and merged share.

    python experiments/ssca/ssca_clustered_table.py RUNS --out results/ssca_clustered [--copy]

RUNS is the `--out` of `experiments/fedmchain/fedmchain_table.py` (runs under
RUNS/runs/<name>-<time>/);
a run's row is its name less the seed (`ssca_clustered_once_fedmchain_s0` ->
`ssca_clustered_once_fedmchain`). `--copy` also copies each run's config.yaml, summary.json and
rounds.parquet to OUT/<name>/ (what results/ keeps); OUT may itself be such a folder.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

KEEP = ("config.yaml", "summary.json", "rounds.parquet")


def run_dirs(root: Path) -> dict[str, Path]:
    """Run name -> its folder: RUNS/runs/<name>-<time>/ (the latest) or OUT/<name>/."""
    found: dict[str, Path] = {}
    for s in sorted(root.glob("runs/*/summary.json")) + sorted(root.glob("*/summary.json")):
        name = json.loads(s.read_text())["name"]
        found[name] = s.parent
    return found


def _ms(values: list[float], pct: bool = True) -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return "–"
    f = 100.0 if pct else 1.0
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{f * statistics.mean(vals):.1f} ± {f * sd:.1f}" if pct else \
        f"{statistics.mean(vals):.2f} ± {sd:.2f}"


def row_of(dirs: list[Path], skip_syncs: int) -> tuple[dict[str, str], list[str]]:
    """One table row and the per-sync ARI cells (mean over seeds) of one setting's runs."""
    rows = [pd.read_parquet(d / "rounds.parquet") for d in dirs]
    evals = [r.dropna(subset=["accuracy"]) for r in rows]
    groups = sorted(c for c in rows[0].columns if c.startswith("acc_group/"))
    out = {"ACC": _ms([e["accuracy"].iloc[-1] for e in evals])}
    out["best ACC"] = _ms([e["accuracy"].max() for e in evals])
    for g in groups:
        out[f"group {g.split('/')[1]}"] = _ms([e[g].iloc[-1] for e in evals])
    syncs = [r.dropna(subset=["ssca/clusters"]) for r in rows] if "ssca/clusters" in \
        rows[0].columns else []
    per_sync: list[str] = []
    if syncs and "ssca/ari" in syncs[0].columns:
        ari = np.array([s["ssca/ari"].to_numpy() for s in syncs])
        out[f"ARI (syncs > {skip_syncs})"] = _ms(list(ari[:, skip_syncs:].mean(axis=1)), False)
        out["min ARI"] = _ms(list(ari[:, skip_syncs:].min(axis=1)), False)
        per_sync = [f"{v:.2f}" for v in ari.mean(axis=0)]
        out["churn"] = _ms([s["ssca/churn"].iloc[1:].mean() for s in syncs])
        out["merged share"] = _ms([s["ssca/merged_share"].mean() for s in syncs])
        out["K'"] = _ms([s["ssca/clusters"].mean() for s in syncs], False)
    return out, per_sync


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--copy", action="store_true")
    ap.add_argument("--skip-syncs", type=int, default=2,
                    help="syncs left out of the ARI mean (the first few; default 2)")
    args = ap.parse_args()
    found = run_dirs(args.runs)
    settings: dict[str, list[Path]] = {}
    for name, d in sorted(found.items()):
        settings.setdefault(re.sub(r"_s\d+$", "", name), []).append(d)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.copy:
        for name, d in found.items():
            if d.parent != args.out:
                (args.out / name).mkdir(exist_ok=True)
                for f in KEEP:
                    shutil.copy2(d / f, args.out / name / f)
    table, ari_lines = [], []
    for label, dirs in settings.items():
        cells, per_sync = row_of(dirs, args.skip_syncs)
        table.append((f"{label} ({len(dirs)} seeds)", cells))
        if per_sync:
            ari_lines.append(f"| {label} | " + " | ".join(per_sync) + " |")
    names = list(dict.fromkeys(k for _, c in table for k in c))
    lines = ["| setting | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(c.get(n, "–") for n in names) + " |"
              for label, c in table]
    text = "\n".join(lines) + "\n"
    if ari_lines:
        n = max(line.count("|") - 2 for line in ari_lines)
        text += ("\nARI per sync (mean over seeds; syncs of the first phase, then the second)\n\n"
                 "| setting | " + " | ".join(str(i + 1) for i in range(n)) + " |\n"
                 + "|---" * (n + 1) + "|\n" + "\n".join(ari_lines) + "\n")
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

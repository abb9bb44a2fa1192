"""Run scenarios over seeds and write one comparison table (a scenario script: plain Python
calling the same `raymm` functions as the CLI's `raymm sweep`).

Example, the TIDE comparison on UCI-HAR (B = TIDE's mean total traffic, as in the paper):

    RAYMM_DATA=/path/to/data python scenarios/sweep.py --seeds 42 123 2024 \\
        --executor serial --out sweeps/tide_har --budget-from tide_har \\
        scenarios/tide_har.yaml scenarios/tide_ablations/01_core.yaml \\
        scenarios/tide_har_fedavg.yaml
"""

from __future__ import annotations

import sys

from raymm.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))

"""Run scenarios over seeds and write one comparison table from Python: an example of calling
raymm the way the CLI's `raymm sweep` does (`raymm.app.cli.main` takes the same arguments).

Example, the TIDE comparison on UCI-HAR (B = TIDE's mean total traffic, as in the paper):

    RAYMM_DATA=/path/to/data python examples/sweep.py --seeds 42 123 2024 \\
        --executor serial --out sweeps/tide_har --budget-from tide_har \\
        scenarios/tide_har.yaml experiments/tide/ablations/01_core.yaml \\
        scenarios/tide_har_fedavg.yaml

Without data, the quickstart over two seeds:

    python examples/sweep.py --seeds 1 2 --executor serial --out sweeps/quick \\
        --set rounds=2 scenarios/quickstart.yaml
"""

from __future__ import annotations

import sys

from raymm.app.cli import main


def sweep(argv: list[str]) -> int:
    """`raymm sweep ARGV`; the exit status."""
    return main(["sweep", *argv])


if __name__ == "__main__":
    sys.exit(sweep(sys.argv[1:]))

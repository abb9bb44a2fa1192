"""How strong each modality of a dataset is: centralised models trained on all training data.

For each seed it trains, on the pooled training split with the scenario's model, optimizer and
batch size (no federation):
- an audio-only and a vision-only model (the other input zeroed, as a device lacking it sees
  it): what each modality reaches on its own;
- a joint model on both inputs, then tested with each input alone: the modality-competition
  signature is a weak modality far below what its own model reaches.
and prints mean ± std over seeds of test accuracy. Used to calibrate the `image_noise` knob of
`scenarios/fedmchain_avdigits_imbalanced.yaml` (target: audio ≥ 85%, vision 45-60%):

    RAYMM_DATA=/path/to/data python experiments/calibration/avdigits_calibration.py \\
        scenarios/fedmchain_avdigits_imbalanced.yaml --seeds 0 1 2 [--set dataset.image_noise=1.2]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
import torch
import torch.nn.functional as F

from raymm import seeding
from raymm.app.build import load_scenario
from raymm.config.schema import Scenario
from raymm.data import dataset_params, load_dataset
from raymm.data.base import Dataset
from raymm.models.build import build_model
from raymm.server.evaluation import evaluate_subset


def train_central(sc: Scenario, data: Dataset, sensors: tuple[str, ...], epochs: int,
                  seed: int) -> dict[str, float]:
    """Train on the whole training split with only `sensors` present; test accuracy with
    every subset of one sensor and with `sensors`."""
    torch.manual_seed(seeding.torch_seed(seed, seeding.SETUP, seeding.SERVER, "central"))
    model = build_model(data, sc.model, seed)
    opt = torch.optim.Adam(model.parameters(), lr=sc.training.lr)
    x = {m: torch.from_numpy(np.asarray(data.train.x[m])) for m in data.sensors}
    y = torch.from_numpy(np.asarray(data.train.y))
    present = torch.tensor([[m in sensors for m in data.sensors]], dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    n, bs = y.shape[0], sc.training.batch_size
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, bs):
            b = perm[start:start + bs]
            xb = {m: x[m][b] if m in sensors else torch.zeros_like(x[m][b]) for m in x}
            loss = F.cross_entropy(model(xb, present.expand(b.shape[0], -1)).logits, y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    out = {"+".join(sensors): evaluate_subset(model, data.test, sensors).accuracy}
    if len(sensors) > 1:
        out.update({m: evaluate_subset(model, data.test, (m,)).accuracy for m in sensors})
    return out


def calibrate(sc: Scenario, seeds: list[int], epochs: int, only: str | None = None
              ) -> dict[str, dict[str, list[float]]]:
    """{model: {tested with: [accuracy per seed]}} for each single-sensor and the joint model
    (`only`: just the model of that one sensor)."""
    results: dict[str, dict[str, list[float]]] = {}
    for seed in seeds:
        data = load_dataset(sc.dataset_name,
                            dataset_params(sc.dataset_name, sc.dataset_params()), seed)
        models = [(only,)] if only else [(m,) for m in data.sensors] + [tuple(data.sensors)]
        for sensors in models:
            name = "+".join(sensors) + (" (joint)" if len(sensors) > 1 else " only")
            for tested, acc in train_central(sc, data, sensors, epochs, seed).items():
                results.setdefault(name, {}).setdefault(tested, []).append(acc)
    return results


def report(results: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| model | tested with | accuracy % (mean ± std) |", "|---|---|---|"]
    for name, tests in results.items():
        for tested, accs in tests.items():
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            lines.append(f"| {name} | {tested} | {100 * statistics.mean(accs):.1f} ± "
                         f"{100 * sd:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", help="also write the raw accuracies here")
    ap.add_argument("--only", help="train only the model of this one sensor")
    args = ap.parse_args()
    sc = load_scenario(args.scenario, args.overrides)
    results = calibrate(sc, args.seeds, args.epochs, args.only)
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()



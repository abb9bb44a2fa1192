"""How well can the HAR model do with one sensor alone? A centralised reference for the
worst-case drop Δ of the federated runs.

Δ zeroes one sensor in every test input, so Δ ≥ (accuracy with both sensors) - (the best
accuracy the weaker sensor reaches alone). This script trains the scenario's model centrally on
the whole training split (no federation, no held-out device parts), once per input set (both
sensors, accelerometer only, gyroscope only, and both with modality dropout as TIDE trains),
and prints the best test accuracy of each input set over the epochs: an optimistic ceiling per
sensor, and the Δ it implies.

    RAYMM_DATA=/path/to/data python experiments/calibration/har_sensor_ceiling.py --epochs 30
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from raymm.app.build import load_scenario
from raymm.data import load_dataset
from raymm.models.build import build_model
from raymm.server.evaluation import evaluate_subset

ROOT = Path(__file__).resolve().parents[2] / "scenarios"


def train(sc, dataset, present: tuple[str, ...], dropout: float, epochs: int, seed: int
          ) -> dict[str, float]:
    """Best test accuracy over epochs with both sensors and with each one alone (the others
    zeroed); for a model trained on every sensor also the Δ of its best all-sensor epoch."""
    torch.manual_seed(seed)
    model = build_model(dataset, sc.model.model_copy(update={"adapter": False}), seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sensors, train_x = dataset.sensors, dataset.train.x
    y_all = torch.from_numpy(np.asarray(dataset.train.y))
    x_all = {m: torch.from_numpy(np.asarray(train_x[m])) for m in sensors}
    mask = torch.tensor([[m in present for m in sensors]], dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    best: dict[str, float] = {}
    for _ in range(epochs):
        perm = torch.randperm(y_all.shape[0], generator=gen)
        for start in range(0, perm.shape[0], 32):
            b = perm[start:start + 32]
            keep = mask.expand(b.shape[0], -1).clone()
            if dropout > 0 and float(torch.rand((), generator=gen)) < dropout:
                keep[:, int(torch.randint(len(sensors), (), generator=gen))] = 0.0
            xb = {m: x_all[m][b] * keep[:, j, None, None] for j, m in enumerate(sensors)}
            loss = F.cross_entropy(model(xb, keep).logits, y_all[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        accs = {"+".join(s): evaluate_subset(model, dataset.test, s).accuracy
                for s in (sensors, *((m,) for m in sensors))}
        if set(present) == set(sensors) and accs["+".join(sensors)] > best.get(
                "+".join(sensors), -1.0):
            best["delta_at_best"] = accs["+".join(sensors)] - min(accs[m] for m in sensors)
        for k, v in accs.items():
            best[k] = max(best.get(k, 0.0), v)
    return best


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=str(ROOT / "tide_har.yaml"))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    sc = load_scenario(args.scenario)
    dataset = load_dataset(sc.dataset_name, sc.dataset_params(), sc.seed)
    torch.set_num_threads(1)
    both = dataset.sensors
    runs = {"both": (both, 0.0), "both+dropout0.2": (both, 0.2),
            **{f"{m} only": ((m,), 0.0) for m in both}}
    out = {name: train(sc, dataset, present, dropout, args.epochs, args.seed)
           for name, (present, dropout) in runs.items()}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

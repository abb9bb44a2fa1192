"""Small scenario builders shared by tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def tiny_scenario(**overrides: Any) -> dict[str, Any]:
    """A small two-sensor synthetic scenario that runs in well under a second per round."""
    sc: dict[str, Any] = {
        "name": "tiny", "seed": 7, "rounds": 3, "method": "fedavg",
        "dataset": {"name": "synthetic", "n_train": 400, "n_test": 100, "classes": 4,
                    "sensors": {"a": {"dim": 8, "informativeness": 1.0},
                                "b": {"dim": 6, "informativeness": 0.4}}},
        "population": {"devices": 12,
                       "tiers": [{"sensors": ["a", "b"], "count": 4},
                                 {"sensors": ["a"], "count": 4},
                                 {"sensors": ["b"], "count": 4}],
                       "availability": [{"pattern": "always", "fraction": 0.5},
                                        {"pattern": "custom", "period": 3, "online": 2,
                                         "fraction": 0.5}],
                       "partition": {"kind": "dirichlet", "alpha": 1.0, "min_samples": 5}},
        "model": {"embed_dim": 8, "hidden": 16, "fusion_dim": 16},
        "training": {"local_epochs": 1, "batch_size": 16, "lr": 0.05},
        "selection": {"name": "random", "k": 5},
        "execution": {"executor": "serial"},
        "output": {"tensorboard": False},
    }
    for key, value in overrides.items():
        node = sc
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return sc


class Payload:
    """Unpickling this creates `marker` (a file): proof that code from a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))

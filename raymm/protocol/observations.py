"""What the server has learned about devices, and nothing more.

Registration tells the server each device's sensor set (it must, to know the pods); each round
tells it who was online, their data sizes, and the simulated training times of those it
selected. Availability clocks are never observed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

WINDOW = 10  # rounds of history kept per device (TIDE's "last 10 rounds")


def sensor_set_sizes(sensor_mask: np.ndarray) -> np.ndarray:
    """Per device: how many devices of `sensor_mask` hold exactly its sensor set."""
    _, inverse, counts = np.unique(sensor_mask, axis=0, return_inverse=True,
                                   return_counts=True)
    return counts[inverse.reshape(-1)]


@dataclass
class Observations:
    sensor_mask: np.ndarray        # bool [n, M], from registration
    tier: np.ndarray               # int [n], from registration
    num_samples: np.ndarray        # int64 [n], -1 until first heard of
    compute_hist: np.ndarray       # float64 [n, WINDOW], NaN where empty (ring buffer)
    compute_count: np.ndarray      # int64 [n], rounds trained (ring position)
    selected_hist: np.ndarray      # bool [WINDOW, n]: selected in round t (row t mod WINDOW)
    times_selected: np.ndarray     # int64 [n]
    times_online: np.ndarray       # int64 [n]

    @classmethod
    def register(cls, sensor_mask: np.ndarray, tier: np.ndarray) -> Observations:
        n = sensor_mask.shape[0]
        return cls(sensor_mask=sensor_mask.copy(), tier=tier.copy(),
                   num_samples=np.full(n, -1, np.int64),
                   compute_hist=np.full((n, WINDOW), np.nan),
                   compute_count=np.zeros(n, np.int64),
                   selected_hist=np.zeros((WINDOW, n), dtype=bool),
                   times_selected=np.zeros(n, np.int64), times_online=np.zeros(n, np.int64))

    @property
    def n(self) -> int:
        return int(self.tier.shape[0])

    @cached_property
    def set_sizes(self) -> np.ndarray:
        """Read-only int [n]: how many registered devices hold exactly device i's sensor set.
        Computed once per instance (the sensor sets never change after registration); not a
        dataclass field, so not part of `state_dict`."""
        sizes = sensor_set_sizes(self.sensor_mask)
        sizes.setflags(write=False)
        return sizes

    def __post_init__(self) -> None:
        # mean_compute's rows, kept up to date by observe_trained (None until first asked);
        # not a dataclass field, so not part of `state_dict`
        self._means: np.ndarray | None = None

    def mean_compute(self, ids: np.ndarray | None = None) -> np.ndarray:
        """Mean simulated training time over the last WINDOW rounds trained (NaN if never),
        of every device or of `ids`. Computed for all devices once, then only the rows of
        devices that trained since (a round changes K rows of a million): the same numbers."""
        if self._means is None:
            self._means = _row_means(self.compute_hist)
        means: npt.NDArray[np.float64] = self._means.copy() if ids is None else self._means[ids]
        return means

    def participation(self) -> np.ndarray:
        """Share of the last WINDOW rounds in which each device was selected."""
        share: npt.NDArray[np.float64] = self.selected_hist.mean(axis=0)
        return share

    def observe_online(self, ids: np.ndarray, num_samples: np.ndarray) -> None:
        self.num_samples[ids] = num_samples
        self.times_online[ids] += 1

    def observe_selected(self, t: int, ids: np.ndarray) -> None:
        row = t % WINDOW
        self.selected_hist[row] = False
        self.selected_hist[row, ids] = True
        self.times_selected[ids] += 1

    def observe_trained(self, ids: np.ndarray, seconds: np.ndarray) -> None:
        pos = self.compute_count[ids] % WINDOW
        self.compute_hist[ids, pos] = seconds
        self.compute_count[ids] += 1
        if self._means is not None:
            self._means[ids] = _row_means(self.compute_hist[ids])

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k).copy() for k in self.__dataclass_fields__}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Observations:
        return cls(**{k: np.array(v) for k, v in state.items()})


def _row_means(hist: np.ndarray) -> np.ndarray:
    """Per row of `hist` [m, WINDOW]: the mean of its non-NaN entries (NaN if none). Each row is
    reduced on its own, so a subset of rows gives the very numbers of the whole array."""
    with np.errstate(invalid="ignore"):
        total = np.nansum(hist, axis=1)
        count = np.sum(~np.isnan(hist), axis=1)
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)

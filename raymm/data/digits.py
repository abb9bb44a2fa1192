"""scikit-learn's bundled 8x8 digits, cut into two "sensor" views (left/right image halves).

It ships with scikit-learn (no download), so it is the smallest real dataset for quick runs
where each modality alone is only partly informative.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.data.base import DataFacts, Dataset, Split, register_dataset

SENSORS = ("left", "right")
#: images per digit 0..9 in scikit-learn's bundled set (fixed data: 1797 images)
CLASS_COUNTS = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)


def stratified_split(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train/test indices holding `test_fraction` of every class in test.

    Written out (not sklearn's `train_test_split`) so the split depends only on numpy's
    seeded generator, not on the installed scikit-learn version.
    """
    rng = np.random.default_rng(seed)
    test: list[np.ndarray] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(test_fraction * idx.size))
        test.append(idx[:n_test])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(y.size), test_idx)
    return train_idx, test_idx


def _views(images: np.ndarray) -> dict[str, np.ndarray]:
    """Columns 0..3 and 4..7 of each image, flattened to 32 float32 features."""
    n = images.shape[0]
    return {
        "left": np.ascontiguousarray(images[:, :, :4].reshape(n, 32), dtype=np.float32),
        "right": np.ascontiguousarray(images[:, :, 4:].reshape(n, 32), dtype=np.float32),
    }


@register_dataset("digits")
class DigitsLoader:
    """Loader for `dataset: {name: digits}`."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        test_fraction: float = Field(0.25, gt=0.0, lt=1.0)

    def sensors(self, params: BaseModel) -> tuple[str, ...]:
        return SENSORS

    def required_files(self, params: BaseModel) -> list[Path]:
        return []

    def facts(self, params: BaseModel) -> DataFacts:
        """Without importing scikit-learn: `stratified_split`'s counts of the fixed data."""
        assert isinstance(params, self.Params)
        n_train = sum(c - int(round(params.test_fraction * c)) for c in CLASS_COUNTS)
        return DataFacts(n_train, None, {m: (32,) for m in SENSORS}, 10)

    def load(self, params: BaseModel, seed: int) -> Dataset:
        # deferred: scikit-learn's import is slow; it loads only when this dataset is used
        from sklearn.datasets import load_digits

        assert isinstance(params, self.Params)
        bunch = load_digits()
        images = np.asarray(bunch.images, dtype=np.float64) / 16.0  # pixel values are 0..16
        y = np.asarray(bunch.target, dtype=np.int64)
        views = _views(images)
        tr, te = stratified_split(y, params.test_fraction, seed)
        return Dataset(
            name="digits",
            sensors=SENSORS,
            num_classes=10,
            train=Split(x={s: v[tr] for s, v in views.items()}, y=y[tr]),
            test=Split(x={s: v[te] for s, v in views.items()}, y=y[te]),
            class_names=tuple(str(c) for c in range(10)),
            meta={"source": "sklearn.datasets.load_digits"},
        )

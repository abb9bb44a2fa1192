"""The `mnist` converters (raymm.data.releases.mnist) on MNIST's idx files: the test and
train splits by hand, each idx problem named."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.data.prepare import prepare
from raymm.errors import DataError

from tiny_releases import idx_bytes, mnist_arrays, mnist_release, npz, zip_tree


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_test_and_train_splits_from_the_idx_files(tmp_path, gz):
    folder = mnist_release(tmp_path / "MNIST" / "raw", gz=gz)
    for name, split, n, seed in (("mnist", "test", 30, 2), ("mnist-train", "train", 12, 1)):
        res = prepare(name, tmp_path / "MNIST", tmp_path / f"{split}.npz")
        z = npz(res.path)
        x, y = mnist_arrays(n, seed)
        assert list(z) == ["x", "y"] and z["x"].dtype == np.uint8 and z["y"].dtype == np.int64
        np.testing.assert_array_equal(z["x"], x)
        np.testing.assert_array_equal(z["y"], y.astype(np.int64))
        assert res.sizes == {"images": n} and res.shapes == {"visual": (28, 28)}
    zpath = zip_tree(folder, tmp_path / "mnist.zip", top="raw/")
    np.testing.assert_array_equal(npz(prepare("mnist", zpath, tmp_path / "z.npz").path)["x"],
                                  mnist_arrays(30, 2)[0])


def test_mnist_idx_problems_are_named(tmp_path):
    folder = mnist_release(tmp_path / "m", gz=False)
    out = tmp_path / "o.npz"
    labels = folder / "t10k-labels-idx1-ubyte"
    good = labels.read_bytes()
    labels.write_bytes(good[:-1])
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte: idx header says \(30,\) "
                                        r"\(30 bytes\) but 29 bytes follow"):
        prepare("mnist", folder, out)
    labels.write_bytes(b"\x00\x00\x0d\x01" + good[4:])
    with pytest.raises(DataError, match=r"not an unsigned-byte idx file \(magic 00000d01\)"):
        prepare("mnist", folder, out)
    labels.write_bytes(idx_bytes(np.full(30, 10, np.uint8)))
    with pytest.raises(DataError, match=r"labels must be digits 0..9, found 10"):
        prepare("mnist", folder, out)
    labels.write_bytes(idx_bytes(np.zeros(29, np.uint8)))
    with pytest.raises(DataError, match=r"do not pair up"):
        prepare("mnist", folder, out)
    labels.unlink()
    with pytest.raises(DataError, match=r"no t10k-labels-idx1-ubyte.gz \(or t10k-labels"):
        prepare("mnist", folder, out)
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(DataError, match=r"unreadable gzip"):
        prepare("mnist", folder, out)
    assert not out.exists()

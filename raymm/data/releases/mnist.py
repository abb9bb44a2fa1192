"""MNIST: handwritten digits, the four idx files.

Converters `mnist` -> `mnist_test_28x28.npz` (the test split, the images of the `avdigits`
dataset, raymm/data/avdigits.py) and `mnist-train` -> `mnist_train_28x28.npz` (the training
split); download source `mnist` (torchvision's mirrors). `REFERENCE` pins the arrays of the test
file the shipped audio-visual digits results were made with and MNIST's exact training split.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from raymm.data.releases.common import Arrays, Converter, Reader, Remote, Source, release_files
from raymm.errors import DataError


def idx_array(data: bytes, where: str) -> np.ndarray:
    """An unsigned-byte idx file (MNIST's format: magic `0x0000 08 <dims>`, big-endian sizes,
    then the values) as a uint8 array of its shape."""
    if len(data) < 4 or data[:3] != b"\x00\x00\x08" or not 1 <= data[3] <= 4:
        raise DataError(f"{where}: not an unsigned-byte idx file (magic {data[:4].hex()})")
    dims = data[3]
    head = 4 + 4 * dims
    if len(data) < head:
        raise DataError(f"{where}: idx header cut short")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) - head != count:
        raise DataError(f"{where}: idx header says {shape} ({count:,} bytes) but "
                        f"{len(data) - head:,} bytes follow")
    return np.frombuffer(data, np.uint8, count, head).reshape(shape).copy()


_MNIST_FILES = r"(train|t10k)-(images-idx3|labels-idx1)-ubyte(\.gz)?"


def _mnist(src: Path, split: str) -> Arrays:
    """`x` uint8 `[n, 28, 28]` and `y` int64 of MNIST's `split` ("t10k" or "train")."""
    with release_files(src, _MNIST_FILES, "mnist", _EXPECTS) as (where, files):
        x, y = (_idx_file(files, f"{split}-{kind}-ubyte", where)
                for kind in ("images-idx3", "labels-idx1"))
    if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise DataError(f"{where}: {split} images {x.shape} and labels {y.shape} do not pair up "
                        f"as [n, 28, 28] and [n]")
    if y.max(initial=0) > 9:
        raise DataError(f"{where}: {split} labels must be digits 0..9, found {int(y.max())}")
    return {"x": x, "y": y.astype(np.int64)}


def _idx_file(files: dict[str, Reader], stem: str, where: str) -> np.ndarray:
    """`stem.gz` (what the download verified) or else `stem` (torchvision unpacks beside it)."""
    if stem + ".gz" in files:
        name = stem + ".gz"
        try:
            data = gzip.decompress(files[name]())
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{where}/{name}: unreadable gzip ({e})") from e
    elif stem in files:
        name, data = stem, files[stem]()
    else:
        raise DataError(f"{where}: no {stem}.gz (or {stem}) in it")
    return idx_array(data, f"{where}/{name}")


def convert_mnist(src: Path, *, progress: bool = False) -> Arrays:
    """MNIST's test split (10000 images, original order) -> `mnist_test_28x28.npz`."""
    return _mnist(src, "t10k")


def convert_mnist_train(src: Path, *, progress: bool = False) -> Arrays:
    """MNIST's training split (60000 images, original order) -> `mnist_train_28x28.npz`."""
    return _mnist(src, "train")


#: `array_sha256` of the arrays of `mnist_test_28x28.npz` as the shipped results used it, and
#: of MNIST's exact training images and labels
REFERENCE = {
    "mnist": {
        "x": "fbf9701b11f5659e6366884b0bbf01ea129fb049e3239251eddb226ada72239e",
        "y": "bc4f9655c228502ea84fb679f1b5c618ad81c0ca308f62e8b89621010716f3d7",
    },
    "mnist-train": {
        "x": "157fe16da1dbced4a1376f4be5df2d665d51d11177dcaf7aa4848b1ff033343f",
        "y": "709bf8e34a5eecad0ba9e319b1d154e9069f3e5492f2bb65e5da9a7ce1e406b2",
    },
}

# both converters read the same files; a folder without them names the test pair
_EXPECTS = ("the MNIST idx files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz), e.g. "
            "torchvision's MNIST/raw folder")
_EXPECTS_TRAIN = ("the MNIST idx files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz), "
                  "e.g. torchvision's MNIST/raw folder")
CONVERTERS = (
    Converter("mnist", "mnist_test_28x28.npz", _EXPECTS, convert_mnist, source="mnist",
              reference=REFERENCE["mnist"]),
    Converter("mnist-train", "mnist_train_28x28.npz", _EXPECTS_TRAIN, convert_mnist_train,
              source="mnist", reference=REFERENCE["mnist-train"]),
)


def torchvision_mnist_mirrors() -> tuple[str, ...]:
    """The MNIST mirrors torchvision's downloader uses (it keeps them current)."""
    # deferred: torchvision pulls in torch; only `download mnist` asks for its mirror list
    from torchvision.datasets import MNIST

    return tuple(MNIST.mirrors)


# MNIST's gz files: the MD5s torchvision checks, and their SHA-256s. The t10k pair and the
# training labels were hashed here from copies with the canonical MD5; the training images'
# SHA-256 is the value published for that file by many independent projects (it agrees with
# the published size, 9,912,422 bytes, and torchvision's MD5 is checked as well).
_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
_MNIST_SHA256 = {  # name: (sha256, bytes)
    "train-images-idx3-ubyte.gz":
        ("440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 9912422),
    "train-labels-idx1-ubyte.gz":
        ("3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 28881),
    "t10k-images-idx3-ubyte.gz":
        ("8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 1648877),
    "t10k-labels-idx1-ubyte.gz":
        ("f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 4542),
}
# torchvision 0.24's mirrors; at download time torchvision's current list replaces them
_MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                  "http://yann.lecun.com/exdb/mnist/")

SOURCE = Source(
    name="mnist",
    title="MNIST handwritten digits: the four idx files, from torchvision's MNIST mirrors",
    homepage="https://yann.lecun.com/exdb/mnist/",
    licence="no licence file; commonly cited as CC BY-SA 3.0; cite LeCun et al., Proc. IEEE "
            "1998",
    files=tuple(Remote(name, tuple(m + name for m in _MNIST_MIRRORS), sha, _MNIST_MD5[name], size)
                for name, (sha, size) in _MNIST_SHA256.items()),
    prepare=("mnist", "mnist-train"),
    mirrors=torchvision_mnist_mirrors,
)

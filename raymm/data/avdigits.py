"""Audio-visual digits: spoken digits (FSDD) paired with handwritten digits (MNIST) by label.

Both sources are real recordings/scans (their origin and licences: docs/data.md); they are
not paired in the files, so each audio clip gets one image of the same digit, drawn without
replacement from the stream (seed, SETUP, SERVER, "avdigits_pairs"). One pair per clip: 3000.
FSDD takes with `index < test_takes` (300 clips at 5) form the pooled test split; the rest
(2700) is the training split that devices partition (and split 80/20 themselves).

- `audio`: log-magnitude spectrogram from `torchaudio.transforms.Spectrogram(n_fft, hop)`,
  log(|X| + 1e-3), standardised with the training split's mean and std, stored `[T, F]`
  (frames × frequency bins) so a 1-D CNN convolves over time with the bins as channels.
  Optional SpecAugment-style masking in training (`freq_mask`/`time_mask`: maximum widths;
  0 = off), drawn from the seeded per-device generator.
- `visual`: 28×28 images scaled to [0, 1]. Two fixed degradations of the camera make vision
  the weak modality of a benchmark (FedMChain's setting: one dominant, one weak modality):
  `image_pool: b` averages b×b pixel blocks (a (28/b)×(28/b) camera, blocks repeated back to
  28×28 so the model is unchanged), and `image_noise: σ` adds Gaussian pixel noise of standard
  deviation σ, drawn once per image from the stream (seed, SETUP, SERVER,
  "avdigits_image_noise") so it is the same image in every epoch and on every device (a sensor
  property, not augmentation). experiments/calibration/avdigits_calibration.py measures what a
  centralised model reaches with each modality.

The two input files come from `raymm data prepare fsdd` (raymm/data/releases/fsdd.py: the FSDD
recordings) and `raymm data prepare mnist` (raymm/data/releases/mnist.py: MNIST's idx files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from raymm import seeding
from raymm.data.base import Dataset, Split, register_dataset, require_file, resolve_data_path
from raymm.errors import DataError

SENSORS = ("audio", "visual")
LOG_FLOOR = 1e-3
class AVDigitsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    audio_path: str = "fsdd_audio_8k.npz"
    #: MNIST images to pair with: the exact test set (default) or the reconstructed train set
    image_path: str = "mnist_test_28x28.npz"
    n_fft: int = Field(256, ge=16)
    hop: int = Field(128, ge=1)
    test_takes: int = Field(5, ge=1, le=49)
    freq_mask: int = Field(0, ge=0)
    time_mask: int = Field(0, ge=0)
    #: σ of fixed additive Gaussian pixel noise on the [0, 1] images (0 = clean)
    image_noise: float = Field(0.0, ge=0, le=10)
    #: average b×b pixel blocks (b divides 28; 1 = full resolution)
    image_pool: Literal[1, 2, 4, 7, 14] = 1


class SpecAugment:
    """Zero one random band of frequency bins (width ≤ freq_mask) and one of frames
    (≤ time_mask) per audio sample, for devices that hold audio. Zero is the standardised mean.
    Functional: returns a new dict, never writes into the batch."""

    def __init__(self, freq_mask: int, time_mask: int) -> None:
        self.freq_mask, self.time_mask = freq_mask, time_mask

    def __call__(self, xb: dict[str, torch.Tensor], held: tuple[str, ...],
                 gen: torch.Generator) -> dict[str, torch.Tensor]:
        if "audio" not in held:
            return xb
        x = xb["audio"]                       # [B, T, F]
        keep = torch.ones_like(x, dtype=torch.bool)
        for axis, width in ((2, self.freq_mask), (1, self.time_mask)):
            if width > 0:
                keep = keep & ~_band(x.shape[0], x.shape[axis], width, gen, axis)
        return {**xb, "audio": x * keep}


def _band(batch: int, size: int, width: int, gen: torch.Generator, axis: int) -> torch.Tensor:
    w = torch.randint(0, min(width, size) + 1, (batch,), generator=gen)
    start = (torch.rand(batch, generator=gen) * (size - w + 1)).floor().long()
    pos = torch.arange(size)[None, :]
    band = (pos >= start[:, None]) & (pos < (start + w)[:, None])   # [B, size]
    return band[:, None, :] if axis == 2 else band[:, :, None]


def log_spectrogram(audio: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """int16 waveforms [N, S] -> float32 log-magnitude spectrograms [N, T, F]."""
    # deferred: torchaudio loads only when recordings are turned into spectrograms
    import torchaudio

    wav = torch.from_numpy(audio.astype(np.float32) / 32768.0)
    spec = torchaudio.transforms.Spectrogram(n_fft=n_fft, hop_length=hop, power=1.0)(wav)
    return torch.log(spec + LOG_FLOOR).transpose(1, 2).contiguous().numpy()


def pool_blocks(img: np.ndarray, b: int) -> np.ndarray:
    """[N, H, W] -> the mean of each b×b block, repeated back to [N, H, W]."""
    n, h, w = img.shape
    means = img.reshape(n, h // b, b, w // b, b).mean(axis=(2, 4))
    return np.repeat(np.repeat(means, b, axis=1), b, axis=2).astype(np.float32)


def pair_images(labels: np.ndarray, image_labels: np.ndarray, seed: int) -> np.ndarray:
    """For each clip, the index of an image with the same label, without replacement."""
    rng = seeding.rng(seed, seeding.SETUP, seeding.SERVER, "avdigits_pairs")
    out = np.empty(labels.shape[0], np.int64)
    for c in np.unique(labels):
        clips = np.flatnonzero(labels == c)
        pool = np.flatnonzero(image_labels == c)
        if pool.shape[0] < clips.shape[0]:
            raise DataError(f"avdigits: only {pool.shape[0]} images of digit {c} for "
                            f"{clips.shape[0]} clips")
        out[clips] = rng.permutation(pool)[:clips.shape[0]]
    return out


@register_dataset("avdigits")
class AVDigitsLoader:
    Params = AVDigitsParams

    def sensors(self, params: BaseModel) -> tuple[str, ...]:
        return SENSORS

    def required_files(self, params: BaseModel) -> list[Path]:
        assert isinstance(params, AVDigitsParams)
        return [resolve_data_path(params.audio_path), resolve_data_path(params.image_path)]

    def load(self, params: BaseModel, seed: int) -> Dataset:
        assert isinstance(params, AVDigitsParams)
        apath = require_file(resolve_data_path(params.audio_path), "dataset.audio_path")
        ipath = require_file(resolve_data_path(params.image_path), "dataset.image_path")
        try:
            with np.load(apath) as a, np.load(ipath) as im:
                audio, y, take = a["audio"], a["label"].astype(np.int64), a["index"]
                speaker = a["speaker"].astype(np.int64)
                images, image_y = im["x"], im["y"].astype(np.int64)
        except (KeyError, OSError, ValueError) as exc:
            raise DataError(f"avdigits: cannot read {apath} / {ipath}: {exc}") from None
        spec = log_spectrogram(audio, params.n_fft, params.hop)
        img = images[pair_images(y, image_y, seed)].astype(np.float32) / 255.0
        if params.image_pool > 1:
            img = pool_blocks(img, params.image_pool)
        if params.image_noise > 0:
            noise = seeding.rng(seed, seeding.SETUP, seeding.SERVER, "avdigits_image_noise")
            img += (params.image_noise * noise.standard_normal(img.shape)).astype(np.float32)
        test = take < params.test_takes
        train_spec = spec[~test]
        mean, std = float(train_spec.mean()), float(train_spec.std())
        del train_spec
        # in place: spec is float32 and a Python float does not promote it (NEP 50), so this is
        # bit-identical to ((spec - mean) / std).astype(np.float32) without two more copies
        spec -= mean
        spec /= std

        def split(mask: np.ndarray) -> Split:  # boolean indexing already copies contiguously
            return Split(x={"audio": spec[mask], "visual": img[mask]},
                         y=y[mask], group=speaker[mask])

        aug = SpecAugment(params.freq_mask, params.time_mask) \
            if params.freq_mask or params.time_mask else None
        return Dataset(name="avdigits", sensors=SENSORS, num_classes=10, train=split(~test),
                       test=split(test), class_names=tuple(str(c) for c in range(10)),
                       meta={"audio": str(apath), "images": str(ipath),
                             "image_noise": params.image_noise,
                             "image_pool": params.image_pool,
                             "spectrogram": {"n_fft": params.n_fft, "hop": params.hop,
                                             "mean": mean, "std": std}},
                       augment=aug)

"""HAPT v2.1 (UCI ML Repository dataset 341): the raw signals of UCI-HAR's subjects and sessions.

Converter `hapt` -> `uci_har_hapt_raw_windows.npz`, the default file of the `har` dataset
(raymm/data/har.py) and so of every HAR scenario; download source `hapt` (UCI's zip).
`REFERENCE` pins every array of the file the shipped HAR results were made with.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from raymm.data import har
from raymm.data.releases.common import (
    Arrays,
    Contents,
    Converter,
    Remote,
    Source,
    progress_bar,
    release_files,
    text_table,
)
from raymm.errors import DataError

#: HAPT subjects held out for test: UCI-HAR v1's split (its subject_test.txt), which HAPT keeps
HAPT_TEST_SUBJECTS = frozenset({2, 4, 9, 10, 12, 13, 18, 20, 24})
HAPT_STEP = har.WINDOW // 2        # 50% overlap, as UCI-HAR v1 cuts its windows
HAPT_RATE_HZ = 50


Recording = tuple[int, np.ndarray, np.ndarray]  # user, acc [n, 3], gyro [n, 3]


def hapt_windows(labels: np.ndarray, recordings: dict[int, Recording]) -> dict[str, np.ndarray]:
    """The windows of `uci_har_hapt_raw_windows.npz`, from the raw HAPT release.

    `labels` is `labels.txt` as rows `(experiment, user, activity, start, end)`, samples counted
    from 1 and inclusive; `recordings[experiment] = (user, acc [n, 3], gyro [n, 3])`, float32.
    Only the six basic activities (1..6) are kept; inside each segment, windows of 128 samples
    start at its first sample and every 64 samples after while they fit. Subjects in
    `HAPT_TEST_SUBJECTS` form the test split. Windows are ordered by subject, experiment,
    segment start, then position. No filter is applied: the values are the raw signals.
    Returns the arrays in the file's key order (with `class_names` and `sample_rate_hz`).
    """
    if labels.ndim != 2 or labels.shape[1] != 5 or labels.shape[0] == 0:
        raise DataError(f"labels.txt: expected rows of 5 integers (experiment user activity "
                        f"start end), got shape {labels.shape}")
    rows: dict[str, list[tuple[int, int, int, int]]] = {"train": [], "test": []}
    for exp, user, activity, start, end in sorted(labels.tolist(),
                                                  key=lambda r: (r[1], r[0], r[3])):
        if not 1 <= activity <= har.NUM_CLASSES:
            continue  # postural transitions (7..12)
        if exp not in recordings:
            raise DataError(f"labels.txt: experiment {exp} has no acc_exp{exp:02d}_user"
                            f"{user:02d}.txt / gyro_... recording")
        rec_user, acc, _ = recordings[exp]
        if rec_user != user:
            raise DataError(f"labels.txt: experiment {exp} is user {user}, but its recording "
                            f"is named for user {rec_user}")
        if not 1 <= start <= end <= acc.shape[0]:
            raise DataError(f"labels.txt: segment {start}..{end} of experiment {exp} lies "
                            f"outside its {acc.shape[0]} samples")
        split = "test" if user in HAPT_TEST_SUBJECTS else "train"
        rows[split] += [(exp, user, activity, k)
                        for k in range(start - 1, end - har.WINDOW + 1, HAPT_STEP)]
    out: dict[str, np.ndarray] = {}
    for sp, r in rows.items():
        if not r:
            raise DataError(f"labels.txt: no {sp} window (test subjects are "
                            f"{sorted(HAPT_TEST_SUBJECTS)}; every other subject trains)")
        idx = np.asarray(r, dtype=np.int64)
        out[f"{sp}_acc"] = np.stack([recordings[e][1][k:k + har.WINDOW] for e, _, _, k in r])
        out[f"{sp}_gyro"] = np.stack([recordings[e][2][k:k + har.WINDOW] for e, _, _, k in r])
        out[f"{sp}_y"] = idx[:, 2] - 1
        out[f"{sp}_subject"] = idx[:, 1]
        out[f"{sp}_exp"] = idx[:, 0]
        out[f"{sp}_start"] = idx[:, 3]
    out["class_names"] = np.asarray(har.CLASS_NAMES)
    out["sample_rate_hz"] = np.asarray(HAPT_RATE_HZ, dtype=np.int64)
    return out


#: the raw signals and labels.txt: 61 acc_expXX_userYY.txt, 61 gyro_..., labels.txt
_HAPT_FILES = r"(acc|gyro)_exp\d+_user\d+\.txt|labels\.txt"
_HAPT_SIGNAL = re.compile(r"acc_exp(\d+)_user(\d+)\.txt")


def convert_hapt(src: Path, *, progress: bool = False) -> Arrays:
    """HAPT v2.1 raw signals -> `uci_har_hapt_raw_windows.npz` (`hapt_windows`): 128-sample
    windows of the raw acc (g) and gyro (rad/s), split by subject as UCI-HAR v1."""
    with release_files(src, _HAPT_FILES, "hapt", _EXPECTS) as (where, files):
        if "labels.txt" not in files:
            raise DataError(f"{where}: no labels.txt beside the raw signals")
        labels = text_table(files["labels.txt"](), f"{where}/labels.txt", np.int64, 5)
        acc_names = sorted(n for n in files if _HAPT_SIGNAL.fullmatch(n))
        orphans = sorted(n for n in files if n.startswith("gyro_")
                         and "acc" + n[4:] not in files)
        if orphans:
            raise DataError(f"{where}: {orphans[0]} has no acc_{orphans[0][5:]} beside it")
        recordings = {}
        for name in progress_bar(acc_names, progress, "hapt", unit="experiment"):
            m = _HAPT_SIGNAL.fullmatch(name)
            assert m is not None
            gyro_name = "gyro" + name[3:]
            if gyro_name not in files:
                raise DataError(f"{where}: {name} has no {gyro_name} beside it")
            # parsed as float64 and rounded once to float32 (what the reference file holds)
            acc, gyro = (text_table(files[n](), f"{where}/{n}", np.float64, 3).astype(np.float32)
                         for n in (name, gyro_name))
            if acc.shape != gyro.shape:
                raise DataError(f"{where}: {name} has {acc.shape[0]} samples but {gyro_name} "
                                f"has {gyro.shape[0]}")
            if not (np.isfinite(acc).all() and np.isfinite(gyro).all()):
                raise DataError(f"{where}: {name} or {gyro_name} holds non-finite values")
            recordings[int(m[1])] = (int(m[2]), acc, gyro)
    try:
        return hapt_windows(labels, recordings)
    except DataError as e:
        raise DataError(f"{where}/{e}") from None


#: `array_sha256` of every array of `uci_har_hapt_raw_windows.npz` as the shipped results used it
REFERENCE = {
    "train_acc": "80b37d4711ab68806d8c64dca414ff8d699d53d5326b537394e4f111368d319f",
    "train_gyro": "25e17c80093648e0c8e3ac34bdd4a26618568b559067f11abcbcc1fb6c266ba8",
    "train_y": "bd0d6650fe6307e2da34de55d0a44380f69dd79f420a97e7fc8c459c8ae30c9b",
    "train_subject": "d75224caf832761f93eece4cf2f71638e9cb2b1976adc00d367c38e773392097",
    "train_exp": "0307571d68dc9f27d8c38132b96282078fbeb372ad3e6a2a87afdba8acb8bb93",
    "train_start": "95c533753fde9cdbc46b2e533343bab35fe272a59aee383c9efe3aad122c628f",
    "test_acc": "3f7858d298eaa0a77d8db53249fffef084a0ca48ec2ce43b87602cdddb4890e9",
    "test_gyro": "beeef47ec9ddec66abacbc92c28f1ab16e57fa561a896a5400ce0259f32a55bc",
    "test_y": "51556a84e1636bdaea0cb6854b3f9d87b4566ecfdf00288c0844f54ac4a64e66",
    "test_subject": "9fd7cec837d7f5db2baf6506b10a705189e56214286512a3adade8a26d9a5250",
    "test_exp": "414f33d3d3438dae83362aec77f057dcc9ed057a570b2b7b3cff8fdc264d1728",
    "test_start": "69db6ebc7dc0c6baeddeb4643713f5b5c5919c502761c9c4a971cb73601b97a1",
    "class_names": "32f32c5740361cb9ad01a7c1facab0e3e899214a637bff5b1c8aa39cb0b0d49f",
    "sample_rate_hz": "a06710b568fdf6b9432a5de9236574d4b349364ae33009edf55b928d51b9493b",
}

_EXPECTS = ("the HAPT raw release: its RawData folder (acc_expXX_userYY.txt, "
            "gyro_expXX_userYY.txt, labels.txt), a folder above it, or UCI's zip")
CONVERTERS = (Converter("hapt", "uci_har_hapt_raw_windows.npz", _EXPECTS, convert_hapt,
                        source="hapt", reference=REFERENCE),)

SOURCE = Source(
    name="hapt",
    title="Smartphone-Based Recognition of Human Activities and Postural Transitions "
          "(HAPT) v2.1, UCI ML Repository dataset 341",
    homepage="https://archive.ics.uci.edu/dataset/341",
    licence="its README: cite Reyes-Ortiz et al., Neurocomputing 2015; no commercial use "
            "(UCI's page is quoted as CC BY 4.0)",
    files=(Remote(
        "hapt_dataset.zip",
        ("https://archive.ics.uci.edu/static/public/341/"
         "smartphone+based+recognition+of+human+activities+and+postural+transitions.zip",),
        sha256="4ac4ae064227c07045a99551876b54d204837e995e298b6488559e209b3deb09",
        size=79596192),),
    contents=Contents(_HAPT_FILES, 123,
                      "d9663d7b5986309dc93ac8efa3d4fd80a7f2a3db0b18e6e7a6b8ade2abbac69b",
                      text=True, what="acc_expXX_userYY.txt, gyro_expXX_userYY.txt, "
                                      "labels.txt"),
    prepare=("hapt",),
)

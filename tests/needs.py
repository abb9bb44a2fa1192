"""What a test does when something outside the clone is absent: it is skipped, with a reason that
says how to provide it, unless the environment requires it, and then it fails.

A clone on a fresh machine has no full datasets and maybe no sshd; `make test` must pass there.
CI has both and sets the `RAYMM_REQUIRE_*` variables (`.ci/run`), so there an absent file or
tool is a failure, never a silent skip:

| variable | makes required |
| --- | --- |
| `RAYMM_REQUIRE_DATA=1` | the full datasets under `$RAYMM_DATA` |
| `RAYMM_REQUIRE_SSHD=1` | sshd, ssh, rsync and nc for the `ray up` test |

The data-path tests that need only a little real data read the subsets in
`tests/fixtures/data/` (committed, see its README), which are always present.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
#: small real-data subsets kept in the repository (tests/fixtures/data/README.md)
FIXTURES = REPO / "tests" / "fixtures" / "data"

#: the commands that make each full data file under $RAYMM_DATA (docs/data.md)
HOW_TO_GET = {
    "uci_har_hapt_raw_windows.npz": "raymm data download hapt; raymm data prepare hapt",
    "fsdd_audio_8k.npz": "raymm data download fsdd; raymm data prepare fsdd",
    "mnist_test_28x28.npz": "raymm data download mnist; raymm data prepare mnist",
}
DATA_HINT = "`raymm data list` shows where each file is expected (docs/data.md)"

LOOPBACK_TOOLS = {"/usr/sbin/sshd": "openssh-server", "ssh": "openssh-client",
                  "ssh-keygen": "openssh-client", "rsync": "rsync", "nc": "netcat-openbsd"}


def required(variable: str) -> bool:
    return os.environ.get(variable, "") not in ("", "0")


def absent(reason: str, variable: str) -> NoReturn:
    """Skip with `reason`, or fail with it when `variable` makes the thing required."""
    if required(variable):
        pytest.fail(f"{reason} [{variable}=1 makes this required]", pytrace=False)
    pytest.skip(f"{reason} [required when {variable}=1]")


def full_data(*names: str) -> Path:
    """The folder `$RAYMM_DATA` when it holds every file in `names`; else a skip (a failure
    under RAYMM_REQUIRE_DATA=1) naming what is missing and how to get it."""
    files = ", ".join(f"{n} (`{HOW_TO_GET[n]}`)" if n in HOW_TO_GET else n
                      for n in names) or "the full datasets"
    root = os.environ.get("RAYMM_DATA")
    if not root:
        absent(f"needs the full data: set RAYMM_DATA to a folder with {files}; {DATA_HINT}",
               "RAYMM_REQUIRE_DATA")
    path = Path(root).expanduser()
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        absent(f"RAYMM_DATA={root} lacks {', '.join(missing)}; it needs {files}; {DATA_HINT}",
               "RAYMM_REQUIRE_DATA")
    return path


def dataset_files(dataset: dict) -> None:
    """The full-data files a scenario's `dataset` section reads, when it names a real
    release (har, avdigits): present, or the test skips (fails under RAYMM_REQUIRE_DATA)."""
    from raymm.data import DATASETS

    if dataset.get("name") in ("har", "avdigits"):
        loader = DATASETS[dataset["name"]]
        params = loader.Params(**{k: v for k, v in dataset.items() if k != "name"})
        full_data(*(p.name for p in loader.required_files(params)))


def loopback_tools() -> None:
    """Skip (fail under RAYMM_REQUIRE_SSHD=1) unless sshd and the client tools `ray up` uses
    on this machine are installed."""
    missing = {tool: pkg for tool, pkg in LOOPBACK_TOOLS.items()
               if not (Path(tool).is_file() if tool.startswith("/") else shutil.which(tool))}
    if missing:
        packages = " ".join(dict.fromkeys(missing.values()))
        absent(f"needs {', '.join(missing)}: apt-get install {packages}", "RAYMM_REQUIRE_SSHD")


def fixture(name: str) -> Path:
    """A committed real-data subset; its absence is a broken checkout, always a failure."""
    path = FIXTURES / name
    assert path.is_file(), f"{path} is missing from the checkout (tests/fixtures/data/README.md)"
    return path


@functools.cache
def batched_matmul_is_batch_invariant() -> bool:
    """Whether torch's CPU matmul gives each batch element the same bits whatever the batch
    size: the premise of every bit-for-bit lock-step test (a device's numbers must not depend
    on the devices it shares a program with). Two patterns, both measured:
    - `bmm` over 8 matrices against one at a time. On an AMD EPYC with AVX-512 the torch 2.9.1
      wheel gives 8 matrices of 7×16 @ 16×64 other last bits than one at a time with two
      threads, not with one (MKL picks its kernels by CPU vendor; MKL_CBWR does not apply).
    - a product with an operand shared by every device, `x @ w.T` under `vmap` (TIDE's
      prototype logits, normalize(z) @ normalize(prototypes).T): vmap folds the devices into
      one `mm` of (devices × rows) rows against the transposed shared matrix, so a device's
      rows are computed in a product whose row count grows with the devices in the program.
      On an Intel Xeon with AVX-512 the same wheel, one thread, computes 8 rows of 8 features
      against 3 prototypes with other last bits alone than inside a product of 16 rows or
      more (seen with few output columns and up to about 10 rows per device); with `w.T`
      made contiguous it does not. That machine's `bmm` is batch-invariant.
    Measured once, when this module is imported, with one torch thread: what every training
    process runs with by default (`training.threads: 1`) and what the tests train with."""
    # deferred: torch only for the tests that ask
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        for n, k, m in ((7, 16, 64), (32, 64, 16), (5, 12, 6)):
            a, b = torch.randn(8, n, k, generator=gen), torch.randn(8, k, m, generator=gen)
            whole = torch.bmm(a, b)
            if not all(torch.equal(whole[i], torch.bmm(a[i:i + 1], b[i:i + 1])[0])
                       for i in range(8)):
                return False
        for n, k, m in ((8, 8, 3), (7, 16, 64), (5, 12, 6)):
            x, w = torch.randn(8, n, k, generator=gen), torch.randn(m, k, generator=gen)
            whole = torch.vmap(torch.mm, in_dims=(0, None))(x, w.T)
            if not all(torch.equal(whole[i], x[i] @ w.T) for i in range(8)):
                return False
        return True
    finally:
        torch.set_num_threads(threads)


#: for a test whose claim is bit-for-bit equality across lock-step batch sizes (or a digest
#: computed where that holds): expected to fail, with the reason, where the BLAS breaks it
needs_batch_invariant_matmul = pytest.mark.xfail(
    not batched_matmul_is_batch_invariant(), strict=False,
    reason="this machine's CPU matmul gives a batch element other bits at another batch size "
           "(tests/needs.py: batched_matmul_is_batch_invariant), so lock-step results differ "
           "with packing in the last bit here")


def cpu_vendor() -> str:
    """The CPU vendor /proc/cpuinfo names ("" where it names none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


#: for a test that compares with a digest computed on an Intel CPU: torch's MKL picks its
#: kernels by CPU vendor, and on an AMD EPYC the same wheel gives other last bits
needs_intel_digest = pytest.mark.xfail(
    cpu_vendor() != "GenuineIntel", strict=False,
    reason="the digest was computed with MKL on an Intel CPU; on other vendors MKL takes other "
           "kernels (measured on an AMD EPYC: other last bits)")

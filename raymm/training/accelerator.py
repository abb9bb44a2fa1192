"""The accelerator: which torch device a host trains on (`execution.accelerator`), decided in one
place for the serial executor and for DeviceActors, and the settings that make training on CUDA
repeat itself.

On the CPU the same seed gives bit-identical numbers whatever the packing, the executor or a
resume. On CUDA, `choose_accelerator` puts torch in deterministic mode before the host puts
anything on the GPU (`deterministic_cuda`): the same seed then gives the same numbers again on
the same GPU model with the same torch, CUDA and cuDNN, for every model whose operations all
have deterministic CUDA kernels. An operation that has none (torch's list: the backward of
adaptive average pooling among them) makes torch warn with its name, and its results may
differ in the last bits between repeats. GPU numbers are not those of the CPU (float32 sums
in another order), and a different packing or lock-step grouping may run other kernels on the
GPU. `tools/gpu_check.sh` checks a given GPU.
"""

from __future__ import annotations

import logging
import os

import torch

from raymm.errors import RaymmError

#: the cuBLAS workspace setting that makes its matrix products repeat (CUDA >= 10.2); cuBLAS
#: reads it when the process first uses it
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
#: the two values NVIDIA documents as deterministic
DETERMINISTIC_WORKSPACES = (":4096:8", ":16:8")

log = logging.getLogger("raymm.training.accelerator")


class DeviceUnavailable(RaymmError):
    """`execution.accelerator: cuda` where torch sees no usable GPU."""


def choose_accelerator(requested: str, cuda_available: bool,
                        gpu_ids: list[str] | None = None) -> tuple[str, str | None]:
    """The torch device, and a note when a GPU Ray assigned is not used.

    `gpu_ids` is what Ray assigned a DeviceActor (`ray.get_gpu_ids()`); None means no Ray
    placement (the serial executor), where `auto` takes the GPU whenever torch sees one. Ray
    hands out GPU ids even when torch cannot use them (a CPU-only torch build, fake GPUs
    declared with `ray start --num-gpus` in tests): under `auto` the actor then trains on CPU and
    says why; under `cuda` that is an error.

    When the answer is `cuda` and torch really has a CUDA device, deterministic mode is switched
    on here (`deterministic_cuda`), before the caller builds anything on the GPU.
    """
    device, note = _choose(requested, cuda_available, gpu_ids)
    if device == "cuda" and torch.cuda.is_available():
        deterministic_cuda()
    return device, note


def _choose(requested: str, cuda_available: bool,
            gpu_ids: list[str] | None) -> tuple[str, str | None]:
    if requested == "cpu":
        return "cpu", None
    if requested == "cuda":
        if gpu_ids is not None and not gpu_ids:
            raise DeviceUnavailable("execution.accelerator is cuda but Ray gave this "
                                    "DeviceActor no GPU; set execution.actor.num_gpus > 0")
        if not cuda_available:
            raise DeviceUnavailable("execution.accelerator is cuda but torch sees no CUDA "
                                    "device (a CPU-only torch build, or no GPU on this "
                                    "machine); use auto or cpu")
        return "cuda", None
    if requested != "auto":
        raise ValueError(f"unknown execution.accelerator {requested!r}")
    if gpu_ids is None:
        return ("cuda" if cuda_available else "cpu"), None
    if not gpu_ids:
        return "cpu", None
    if not cuda_available:
        return "cpu", (f"Ray assigned GPU(s) {', '.join(gpu_ids)} but torch sees no CUDA device; "
                       "training on CPU")
    return "cuda", None


def deterministic_cuda() -> dict[str, object]:
    """Switch this process's torch to deterministic CUDA, and return what was set.

    - `CUBLAS_WORKSPACE_CONFIG=:4096:8` (kept if it already holds a deterministic value), so
      cuBLAS's matrix products repeat;
    - `torch.use_deterministic_algorithms(True, warn_only=True)`: every operation with a
      deterministic CUDA kernel uses it, and one without warns with its name instead of
      stopping the run;
    - cuDNN: no benchmarking (which may pick another convolution algorithm each run) and
      deterministic algorithms only.

    The settings are process-wide and stay after the run (a notebook that ran raymm on CUDA
    keeps them). cuBLAS reads its workspace setting once, when the process first uses it: a
    process that used CUDA before this call keeps its own, and a warning says so.
    """
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in DETERMINISTIC_WORKSPACES:
        if torch.cuda.is_initialized():
            log.warning("CUDA was in use before raymm set CUBLAS_WORKSPACE_CONFIG=%s; matrix "
                        "products may not repeat exactly. Set it in the environment before "
                        "the process first uses CUDA.", CUBLAS_WORKSPACE_CONFIG)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return {"CUBLAS_WORKSPACE_CONFIG": os.environ["CUBLAS_WORKSPACE_CONFIG"],
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cudnn.deterministic": torch.backends.cudnn.deterministic}

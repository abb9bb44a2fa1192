"""Which torch device a host trains on (`execution.device`), decided in one place for the serial
executor and for DeviceActors."""

from __future__ import annotations

from raymm.errors import RaymmError


class DeviceUnavailable(RaymmError):
    """`execution.device: cuda` where torch sees no usable GPU."""


def choose_torch_device(requested: str, cuda_available: bool,
                        gpu_ids: list[str] | None = None) -> tuple[str, str | None]:
    """The torch device, and a note when a GPU Ray assigned is not used.

    `gpu_ids` is what Ray assigned a DeviceActor (`ray.get_gpu_ids()`); None means no Ray
    placement (the serial executor), where `auto` takes the GPU whenever torch sees one. Ray
    hands out GPU ids even when torch cannot use them (a CPU-only torch build, fake GPUs
    declared with `ray start --num-gpus` in tests): under `auto` the actor then trains on CPU and
    says why; under `cuda` that is an error.
    """
    if requested == "cpu":
        return "cpu", None
    if requested == "cuda":
        if gpu_ids is not None and not gpu_ids:
            raise DeviceUnavailable("execution.device is cuda but Ray gave this DeviceActor no "
                                    "GPU; set execution.actor.num_gpus > 0")
        if not cuda_available:
            raise DeviceUnavailable("execution.device is cuda but torch sees no CUDA device "
                                    "(a CPU-only torch build, or no GPU on this machine); use "
                                    "auto or cpu")
        return "cuda", None
    if requested != "auto":
        raise ValueError(f"unknown execution.device {requested!r}")
    if gpu_ids is None:
        return ("cuda" if cuda_available else "cpu"), None
    if not gpu_ids:
        return "cpu", None
    if not cuda_available:
        return "cpu", (f"Ray assigned GPU(s) {', '.join(gpu_ids)} but torch sees no CUDA device; "
                       "training on CPU")
    return "cuda", None

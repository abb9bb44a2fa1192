"""The trained model of a run, saved in its run directory and loaded back without any data.

`model.safetensors` holds the global model as the torch module's named parameters (any
safetensors reader can open it); its metadata records what rebuilds the module: sensors, input
shapes, classes, the scenario's `model:` section and seed, the round and the parameter groups.
When a method keeps more, `device_models.safetensors` (a `raymm.io.statefile`) holds the SSCA
cluster models with each device's assignment, and each device's kept parameters (its own
vectors under `training.exchange: delta|none`, its residual adapter, its private blocks under
`model.private`: the global model holds their initial values, a device's model its own).

    import raymm
    net = raymm.load_model("runs/quickstart-20260101-120000")        # global model
    mine = raymm.load_model(run_dir, device=17)                      # the model device 17 uses
    out = net({m: x[m] for m in net.sensors}, present)               # see MultimodalNet.forward
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from raymm.config.schema import ModelSpec, Scenario
from raymm.data.base import Dataset
from raymm.errors import RaymmError
from raymm.io import statefile
from raymm.io.atomic import atomic_output
from raymm.models.build import build_model, build_net
from raymm.models.layout import BUFFERS, PRIVATE, GroupLayout
from raymm.models.network import RaymmNet

MODEL = "model.safetensors"
DEVICES = "device_models.safetensors"
KIND = "raymm-model"
DEVICES_KIND = "raymm-device-models"
LOCAL_KEY = "local"
BUFFERS_KEY = "buffers"
PRIVATE_KEY = "private"
PARAMS_PREFIX = "params/"


def write(run_dir: Path, sc: Scenario, dataset: Dataset, round: int,
          params: dict[str, np.ndarray], clusters: Any = None,
          kept: dict[int, dict[str, np.ndarray]] | None = None) -> Path:
    """Write the model files of a run (global groups; cluster models and kept device
    parameters when there are any). `clusters` is a `raymm.protocol.messages.ClusterModels`;
    `kept` holds, per device, the parameters it keeps (`LOCAL_KEY`, `PARAMS_PREFIX` + group)."""
    net = build_model(dataset, sc.model, sc.seed)
    layout = GroupLayout(net, sc.model.buffers)
    groups = [g for g in layout.groups if g in params]
    named = {s.name: np.asarray(params[g][s.start:s.stop], np.float32).reshape(s.shape)
             for g in groups for s in layout.slots[g]}
    info = {"sensors": list(dataset.sensors),
            "shapes": {m: list(dataset.sensor_shape(m)) for m in dataset.sensors},
            "num_classes": int(dataset.num_classes), "model": sc.model.model_dump(mode="json"),
            "seed": sc.seed, "round": round, "name": sc.name, "devices": sc.population.devices,
            "exchange": sc.training.exchange, "groups": {g: layout.names([g]) for g in groups}}
    path = run_dir / MODEL
    with atomic_output(path) as f:
        f.write(statefile.named_to_bytes(named, KIND, info))
    if clusters is not None or kept:
        tree = {"clusters": None if clusters is None else {
            "params": dict(clusters.params), "assignment": dict(clusters.assignment),
            "clustered": dict(clusters.clustered)}, "devices": kept or {}}
        with atomic_output(run_dir / DEVICES) as f:
            f.write(statefile.to_bytes(tree, DEVICES_KIND))
    return path


def load_model(run_dir: str | Path, device: int | None = None) -> RaymmNet:
    """The trained model of a run directory as a `raymm.models.MultimodalNet` (eval mode).

    With `device=i`, the model device i uses: its cluster's model where SSCA clustered it, its
    own parameters where it keeps them (`exchange: none`), and its residual adapter (call the
    module with `use_adapter=True`). Reads only tensors and JSON: nothing in the directory
    runs. Raises RaymmError when the files are missing, damaged or do not fit.
    """
    run_dir = Path(run_dir)
    path = run_dir / MODEL
    if not path.is_file():
        raise RaymmError(f"{run_dir}: no {MODEL} (runs of raymm 0.1 did not write one)")
    try:
        named, info = statefile.read_named(path, KIND)
        spec = ModelSpec.model_validate(info["model"])
        net = _build(info, spec)
        vectors = _device_vectors(run_dir, info, device) if device is not None else {}
        net.load_state_dict({k: _tensor(v) for k, v in named.items()}, strict=False)
    except (statefile.StateFormatError, KeyError, TypeError, ValueError, RuntimeError,
            IndexError) as exc:
        raise RaymmError(f"{path}: cannot load the model ({type(exc).__name__}: {exc})"
                         ) from None
    if vectors:
        GroupLayout(net, spec.buffers).load(net, vectors)
    return net.eval()


def _build(info: dict[str, Any], spec: ModelSpec) -> RaymmNet:
    shapes = {m: tuple(int(d) for d in s) for m, s in info["shapes"].items()}
    return build_net(tuple(info["sensors"]), shapes, int(info["num_classes"]), spec,
                     int(info["seed"]))


def _tensor(v: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(v, np.float32))


def _device_vectors(run_dir: Path, info: dict[str, Any], device: int) -> dict[str, np.ndarray]:
    """Group vectors of one device, as `raymm.protocol.exchange.eval_vectors` chooses them."""
    if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or \
            not 0 <= int(device) < int(info["devices"]):
        raise ValueError(f"device must be an id in 0..{int(info['devices']) - 1}, got {device!r}")
    tree: dict[str, Any] = {"clusters": None, "devices": {}}
    if (run_dir / DEVICES).is_file():
        tree, _ = statefile.read(run_dir / DEVICES, DEVICES_KIND)
    own = tree["devices"].get(int(device), {})
    out: dict[str, np.ndarray] = {}
    if info["exchange"] == "none":
        out.update({k[len(PARAMS_PREFIX):]: v for k, v in own.items()
                    if k.startswith(PARAMS_PREFIX)})
    elif tree["clusters"] is not None:
        c = tree["clusters"]
        for g, models in c["params"].items():
            if bool(c["clustered"][g][device]):
                out[g] = models[int(c["assignment"][g][device])]
    if LOCAL_KEY in own:
        out[LOCAL_KEY] = own[LOCAL_KEY]
    if BUFFERS_KEY in own:  # its own batch-norm statistics (model.buffers: local)
        out[BUFFERS] = own[BUFFERS_KEY]
    if PRIVATE_KEY in own:  # its own head / fusion (model.private)
        out[PRIVATE] = own[PRIVATE_KEY]
    return out

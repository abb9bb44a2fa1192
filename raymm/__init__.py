"""raymm: a Ray-actor-based simulator for multimodal federated learning on IoT devices.

The core package is free of Ray; `actors` is the Ray boundary and `policies` holds the
pluggable decisions. `raymm.run` is the one entry point the CLI and scenario scripts share.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "run", "load_scenario"]


def __getattr__(name: str):  # lazy, so `import raymm` stays cheap (no torch import)
    if name == "run":
        from raymm.api import run

        return run
    if name == "load_scenario":
        from raymm.config import load_scenario

        return load_scenario
    raise AttributeError(name)

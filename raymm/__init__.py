"""raymm: a Ray-actor-based simulator for multimodal federated learning on IoT devices.

The core package is free of Ray; `actors` is the Ray boundary and `policies` holds the
pluggable decisions. `raymm.run` is the one entry point the CLI and scenario scripts share;
`raymm.load_runs` reads finished runs back as pandas tables.
"""

from __future__ import annotations

__version__ = "0.2.0"

__all__ = ["__version__", "run", "load_scenario", "load_model", "load_runs"]


def __getattr__(name: str):  # lazy, so `import raymm` stays cheap (no torch import)
    if name == "run":
        # deferred: `import raymm` stays cheap (no torch, no Ray)
        from raymm.app.api import run

        return run
    if name == "load_scenario":
        # deferred: `import raymm` stays cheap (no torch, no Ray)
        from raymm.app.build import load_scenario

        return load_scenario
    if name == "load_model":
        # deferred: `import raymm` stays cheap (no torch, no Ray)
        from raymm.app.api import load_model

        return load_model
    if name == "load_runs":
        # deferred: `import raymm` stays cheap (pandas loads only when runs are read)
        from raymm.results.runs import load_runs

        return load_runs
    raise AttributeError(name)

"""The plugin module raymm imports (`--plugin mylab.fl`, or the `raymm.plugins` entry point):
importing it registers the dataset, the policies, the model factory and the named method
`mylab_robust`."""

from __future__ import annotations

from mylab import data, models, policies  # noqa: F401  (importing them registers them)
from raymm.protocol.registry import register_preset

register_preset("mylab_robust", {
    "selection": {"name": "mylab_most_data"},
    "aggregation": {"name": "mylab_median"},
    "schedule": {"name": "joint"},
    "objective": {"name": "ce"},
    "training": {"upload": "all"},
})

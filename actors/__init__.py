"""The Ray boundary: DeviceActor, ServerActor, the Ray executor and resource packing.

Thin shells only: every decision is a call into `raymm` (the core) or `policies`.

May import: base, io, config, data, models, population, protocol, training, device, server, sim.
"""

import time

#: when this process first imported the Ray layer: a DeviceActor's start-up timings count its
#: imports (torch, raymm) from here
IMPORTED_AT = time.time()

"""The Ray boundary: DeviceActor, ServerActor, the Ray executor and resource packing.

Thin shells only: every decision is a call into `raymm` (the core) or `policies`.
"""

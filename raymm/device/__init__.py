"""A host of simulated devices (`host.DeviceHost`, what a DeviceActor wraps) and its training:
one device at a time (`sequential`, the reference) or many in lock-step under `torch.func`
(`lockstep`, `lockstep_host`), both through the one local update (`local_update`); per-device
evaluation on hosts, and which torch device a host trains on.

May import: base, io, config, data, models, population, protocol.
"""

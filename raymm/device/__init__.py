"""What a simulated device is and does: a host of many devices in one process (`host.DeviceHost`,
what a DeviceActor wraps: availability, faults, what devices keep and send), the host whose
selected devices train in lock-step (`lockstep_host`), per-device evaluation (`evaluation`),
warming a host up (`warmup`) and its memory estimate (`footprint`). How a device trains is
`raymm.training`.

May import: base, io, config, data, models, population, protocol, training.
"""

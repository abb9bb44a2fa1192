"""The training engine: a device's local update written once (`local_update`: the loss of a
minibatch, the minibatch loop, the optimizer step), the sequential trainer that runs it one
device after another (`sequential`, the reference), the lock-step trainer that runs it for
many devices at once under `torch.func` (`lockstep`, the fast path), and which torch device,
the accelerator, the training runs on (`accelerator`). What a simulated device is and does
(its host, evaluation, memory) is `raymm.device`, which calls in here.

Kernels that use private torch APIs live in `_kernels` alone; its README lists every one of
them, the checklist for a torch upgrade.

May import: base, io, config, data, models, population, protocol.
"""

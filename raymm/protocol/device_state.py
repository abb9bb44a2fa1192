"""What one simulated device keeps between rounds, in one typed place.

A device's state lives on its host and never travels to the server: its residual adapter
(the model's `local` group), its private blocks (the `private` group, `model.private`), the
parameters `raymm.protocol.exchange` has it keep (its own vectors
under `exchange: none|personal`, or inside a `delta` sync window, and that window's bases),
and what its objective's hooks keep (`Objective.device_finish`, e.g. SCAFFOLD's control
variate). Hosts replace a device's state as a whole after each round; nothing mutates one.

On the wire to the driver (a restarted actor gets its devices back) and in checkpoints a
state is a *record*, the format checkpoints have always had: nothing (None), the adapter
array alone, or one flat dict of named arrays -- `local`, `buffers/own`, `private/own`,
`params/<group>`, `base/<group>`, and the objective's own keys as they are.
`to_record`/`from_record` are exact inverses, so old checkpoints read back unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

#: record keys (the adapter, the device's own batch-norm statistics, and the prefixes of the
#: exchange's two kinds of vectors)
ADAPTER = "local"
BUFFERS = "buffers/own"
PRIVATE = "private/own"
PARAMS = "params/"
BASE = "base/"


@dataclass(frozen=True)
class DeviceState:
    """One device's state between rounds (all fields empty: it keeps nothing)."""

    #: its residual adapter (the `local` group), once it trained one
    adapter: np.ndarray | None = None
    #: group -> its own parameter vector (`raymm.protocol.exchange`: none/personal; delta in a
    #: window)
    params: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: group -> the server vector its delta sync window started from (delta only)
    base: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: what the objective's hooks keep (`DeviceFinish.state`), keyed as the objective names it
    objective: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: its own batch-norm statistics (`model.buffers: local`), once it trained
    buffers: np.ndarray | None = None
    #: its own trained private blocks (the `private` group, `model.private`), once it trained
    private: np.ndarray | None = None

    def is_empty(self) -> bool:
        return self.adapter is None and self.buffers is None and self.private is None and \
            not (self.params or self.base or self.objective)

    def to_record(self) -> StateRecord:
        """The checkpoint/wire form: None, the adapter array, or one flat dict of arrays."""
        if not (self.params or self.base or self.objective) and self.buffers is None and \
                self.private is None:
            return self.adapter
        out: dict[str, np.ndarray] = {**{PARAMS + g: v for g, v in self.params.items()},
                                      **{BASE + g: v for g, v in self.base.items()},
                                      **self.objective}
        if self.adapter is not None:
            out[ADAPTER] = self.adapter
        if self.buffers is not None:
            out[BUFFERS] = self.buffers
        if self.private is not None:
            out[PRIVATE] = self.private
        return out

    @classmethod
    def from_record(cls, record: object) -> DeviceState:
        """The inverse of `to_record`; a record of another shape is a TypeError."""
        if record is None:
            return EMPTY
        if isinstance(record, np.ndarray):
            return cls(adapter=record)
        if not isinstance(record, Mapping) or not all(isinstance(k, str) for k in record):
            raise TypeError(f"a device's state must be an array or a dict of named arrays, "
                            f"got {type(record).__name__}")
        params, base, objective = {}, {}, {}
        for k, v in record.items():
            if k.startswith(PARAMS):
                params[k[len(PARAMS):]] = v
            elif k.startswith(BASE):
                base[k[len(BASE):]] = v
            elif k not in (ADAPTER, BUFFERS, PRIVATE):
                objective[k] = v
        return cls(record.get(ADAPTER), params, base, objective, record.get(BUFFERS),
                   record.get(PRIVATE))


EMPTY = DeviceState()

#: `DeviceState.to_record`'s form: None, the adapter array, or one flat dict of named arrays
StateRecord: TypeAlias = np.ndarray | dict[str, np.ndarray] | None

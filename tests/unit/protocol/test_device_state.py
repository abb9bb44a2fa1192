"""What one device keeps between rounds (raymm.protocol.device_state): its records travel and
are checkpointed in the format checkpoints always held."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.protocol.device_state import EMPTY, DeviceState


def test_device_state_records_keep_the_checkpoint_format() -> None:
    """A device's state travels and is checkpointed as the record checkpoints always held:
    None, the adapter array alone, or one flat dict; reading one back is exact."""
    a = np.arange(2, dtype=np.float32)
    assert EMPTY.to_record() is None and DeviceState.from_record(None).is_empty()
    assert DeviceState(adapter=a).to_record() is a
    assert DeviceState.from_record(a).adapter is a
    old = {"params/g": a, "base/g": a + 1, "scaffold_ci/g": a + 2, "local": a + 3}
    st = DeviceState.from_record(old)
    assert st.params["g"] is a and st.base["g"].tolist() == [1, 2]
    assert set(st.objective) == {"scaffold_ci/g"} and st.adapter.tolist() == [3, 4]
    again = st.to_record()
    assert again.keys() == old.keys() and all(again[k] is old[k] for k in old)
    with pytest.raises(TypeError, match="array or a dict"):
        DeviceState.from_record([1.0, 2.0])


def test_private_blocks_travel_and_are_checkpointed_apart_from_the_objective() -> None:
    """A device's private blocks (`model.private`) are a record key of their own: read back
    into `private`, not taken for the objective's state, and a state holding them is kept."""
    a = np.arange(3, dtype=np.float32)
    st = DeviceState(private=a)
    assert not st.is_empty()
    rec = st.to_record()
    assert isinstance(rec, dict) and rec.keys() == {"private/own"}
    back = DeviceState.from_record(rec)
    assert back.private is a and not back.objective and back.adapter is None
    both = DeviceState.from_record({"private/own": a, "local": a + 1, "mine": a + 2})
    assert both.private is a and set(both.objective) == {"mine"}

"""The typed registries (raymm.protocol.registry) hold only subclasses of their seam."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.protocol.registry import POLICY_SECTIONS, Registry
from raymm.protocol.seams import SelectionContext, Selector


def test_registries_hold_only_subclasses_of_their_seam():
    for section, registry in POLICY_SECTIONS.items():
        for name in registry.names():
            assert issubclass(registry.get(name), registry.base), (section, name)

    class Duck:  # has the method, not the contract
        def select(self, ctx: SelectionContext) -> np.ndarray:
            return ctx.eligible

    with pytest.raises(TypeError, match="must subclass raymm.protocol.seams.Selector"):
        Registry("selection policy", Selector).register("duck")(Duck)  # type: ignore[arg-type]

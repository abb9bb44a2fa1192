"""What the server has learned about devices (raymm.protocol.observations), and nothing more."""

from raymm.protocol.observations import Observations


def test_server_observations_hold_no_clock():
    fields = set(Observations.__dataclass_fields__)
    assert not fields & {"period", "phase", "online_len", "pattern"}

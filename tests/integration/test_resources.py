"""A packing that cannot fit the cluster fails fast with the numbers, before anything runs."""

import pytest
import yaml

from raymm.app.cli import main

from helpers import tiny_scenario


@pytest.mark.ray
@pytest.mark.parametrize("actor, per_actor, needle", [
    # the session's Ray has two (fake) GPUs: three actors of one GPU each cannot fit
    ({"num_cpus": 0.5, "num_gpus": 1}, 4, "need CPU=1.5, GPU=3 but the cluster has CPU=2, GPU=2"),
    ({"num_cpus": 0.5, "resources": {"edge_tpu": 1}}, "auto", "edge_tpu=1"),
    ({"num_cpus": 1}, 1, "12 DeviceActor(s) need CPU=12 but the cluster has CPU=2"),
])
def test_unfittable_packing_exits_2_without_hanging(tmp_path, capsys, ray_session, actor,
                                                    per_actor, needle):
    raw = tiny_scenario(**{"execution.executor": "ray", "execution.actor": actor,
                           "execution.devices_per_actor": per_actor})
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    out = tmp_path / "runs"
    assert main(["run", str(p), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not out.exists()

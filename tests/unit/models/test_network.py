"""The multimodal network (raymm.models.network): the residual adapter's bottleneck is a
setting, half the fusion width by default (what the committed TIDE tables ran with), a quarter
as TIDE's design asks."""

import pytest
from pydantic import ValidationError

from raymm.config.schema import ModelSpec
from raymm.data import load_dataset
from raymm.models.build import build_model


@pytest.mark.parametrize("share,width", [(None, 32), (0.5, 32), (0.25, 16), (0.01, 1)])
def test_adapter_width(share, width):
    ds = load_dataset("synthetic", {"n_train": 20, "n_test": 5}, 0)
    extra = {} if share is None else {"adapter_bottleneck": share}
    model = build_model(ds, ModelSpec(adapter=True, fusion_dim=64, **extra), 0)
    assert model.adapter[0].out_features == width and model.adapter[2].in_features == width


def test_adapter_share_is_bounded():
    with pytest.raises(ValidationError):
        ModelSpec(adapter_bottleneck=0)
    with pytest.raises(ValidationError):
        ModelSpec(adapter_bottleneck=1.5)

"""asyncrl.precision.dtypes: the one name -> dtype table and the one "auto" rule."""

import typing

import pytest
import torch

from asyncrl.precision import dtypes
from asyncrl.models.config import ModelConfig


def test_config_names_are_the_table():
    assert typing.get_args(typing.get_type_hints(ModelConfig)["dtype"]) == ("auto", *dtypes.DTYPES)


@pytest.mark.parametrize("device, want", [("cpu", torch.float32), ("cuda", torch.bfloat16), ("cuda:1", torch.bfloat16),
                                          (torch.device("cuda", 0), torch.bfloat16), (torch.device("cpu"), torch.float32)])
def test_auto(device, want):
    assert dtypes.torch_dtype("auto", device) is want


def test_names_and_dtypes_pass():
    assert dtypes.torch_dtype("float16", "cuda") is torch.float16
    assert dtypes.torch_dtype(torch.float64, "cpu") is torch.float64


def test_unknown_name():
    with pytest.raises(ValueError, match="use 'auto' or one of"):
        dtypes.torch_dtype("fp16", "cpu")

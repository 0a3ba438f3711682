"""The one device spelling (scaling.common.device): what torch accepts for a training or an analysis."""

import pytest

from scaling.common.device import check_device, valid_device
from scaling.common.errors import UserError


@pytest.mark.parametrize("text", ["auto", "cpu", "cuda", "cuda:0", "cuda:15"])
def test_valid(text):
    assert check_device(text) == text


@pytest.mark.parametrize("text", ["tpu", "mps", "cuda:", "cuda:-1", "cuda:\u0663", "cuda:\uff11", " cpu", "",
                                  None, 3])
def test_refused_in_one_line(text):
    assert not valid_device(text)
    with pytest.raises(UserError, match="must be auto, cpu, cuda or cuda:N"):
        check_device(text)

"""DataParallel with the loss inside ``forward``: one loss per GPU, their mean the batch's loss.

Notebook 07 advises computing the loss inside ``forward`` when using ``nn.DataParallel`` (only
one number per GPU is gathered). The notebook quotes the docstring; this proves the behaviour,
which needs two GPUs: on fewer it is skipped, saying why.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tutorial_utils.models import MLP, mlp_batch

needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="nn.DataParallel splits a batch only over 2+ GPUs"
)


class ModelWithLoss(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.model(x), y)


@needs_two_gpus
def test_dataparallel_gathers_one_loss_per_gpu_whose_mean_is_the_batch_loss():
    x = mlp_batch(batch=8, d_in=16, seed=1)
    y = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    with_loss = ModelWithLoss(MLP(d_in=16, d_hidden=32, d_out=4, seed=0)).to("cuda:0")
    full_batch_loss = F.mse_loss(with_loss.model(x.to("cuda:0")), y.to("cuda:0"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Was asked to gather along dimension 0"
        per_device = nn.DataParallel(with_loss, device_ids=[0, 1])(x, y)
    assert per_device.shape == (2,), "one loss per GPU, gathered on the first"
    assert torch.allclose(per_device.mean(), full_batch_loss, atol=1e-6)

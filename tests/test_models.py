"""models: seeded demo models that never touch the learner's random state (issue 16)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tutorial_utils import models

# sum and sum of squares (in float64) of every parameter, as built before issue 16 by
# `torch.manual_seed(seed)` inside each constructor: the notebooks' outputs depend on them.
BEFORE = {
    "MLP": (lambda: models.MLP(), 2.8272763193, 346.1842504978),
    "MLP3": (
        lambda: models.MLP(d_in=32, d_hidden=64, d_out=4, depth=3, seed=3),
        -7.336368353,
        44.9961139055,
    ),
    "ConvNet": (lambda: models.ConvNet(), 44.6655411873, 67.4978743766),
    "LSTMClassifier": (lambda: models.LSTMClassifier(), -232.8996948559, 64110.7195531378),
    "TinyTransformer": (lambda: models.TinyTransformer(), 14.9584392616, 64558.3333212617),
    "EmbeddingBagClassifier": (
        lambda: models.EmbeddingBagClassifier(),
        -2524.3223443855,
        3197404.7343764333,
    ),
    "TiedLM": (lambda: models.TiedLM(seed=5), -304.9262798506, 128368.6572098476),
}


def _digest(model: nn.Module) -> tuple[float, float]:
    with torch.no_grad():
        params = [p.double() for p in model.parameters()]
        return float(sum(p.sum() for p in params)), float(sum((p * p).sum() for p in params))


@pytest.mark.parametrize("name", list(BEFORE))
def test_weights_are_the_same_as_before(name):
    build, total, squares = BEFORE[name]
    assert _digest(build()) == pytest.approx((total, squares), rel=1e-9, abs=1e-7)


def test_mlp_equals_the_same_layers_after_manual_seed():
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    built = models.MLP().net
    for (k, a), (_, b) in zip(
        reference.state_dict().items(), built.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("name", list(BEFORE))
def test_building_a_model_leaves_the_global_generator_alone(name):
    build = BEFORE[name][0]
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    build()
    # before issue 16 this drew from a generator reset to the model's seed
    assert torch.equal(torch.rand(3), expected)


def test_same_seed_same_weights_different_seed_different_weights():
    a, b, c = models.MLP(seed=7), models.MLP(seed=7), models.MLP(seed=8)
    assert torch.equal(a.net[0].weight, b.net[0].weight)
    assert not torch.equal(a.net[0].weight, c.net[0].weight)


def test_batches_are_seeded_and_leave_the_global_generator_alone():
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    x1, x2 = models.mlp_batch(4, 8, seed=3), models.mlp_batch(4, 8, seed=3)
    assert torch.equal(x1, x2) and torch.equal(torch.rand(2), expected)


def test_tied_lm_with_a_transformer_mixer_shares_one_weight_and_refuses_other_mixers():
    model = models.TiedLM(vocab=50, d_model=16, mixer="transformer")
    assert isinstance(model.mix, nn.TransformerEncoderLayer)
    assert model.out.weight is model.embed.weight
    assert model(torch.randint(0, 50, (2, 5))).shape == (2, 5, 50)
    with pytest.raises(ValueError, match="mixer must be 'mlp' or 'transformer', not 'lstm'"):
        models.TiedLM(mixer="lstm")

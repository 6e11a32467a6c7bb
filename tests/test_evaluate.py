"""The evaluation loop in-process on a tiny model: flip TTA."""

from __future__ import annotations

import pytest
import torch

from dali_train.distributed import DistInfo
from dali_train.evaluate import evaluate


def test_evaluate_with_flip_tta_scores_the_mean_logits_of_each_image_and_its_mirror():
    """FFCV's lr_tta: a model that is not mirror-symmetric scores differently with it, and exactly
    as the mean of its two passes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(5))
    batches = [(torch.randn(8, 3, 6, 6), torch.randint(0, 5, (8,))) for _ in range(3)]
    model(batches[0][0])  # materialize the lazy layer
    cpu, one = torch.device("cpu"), DistInfo(0, 0, 1)
    plain = evaluate(model, batches, device=cpu, dist=one)
    tta = evaluate(model, batches, device=cpu, dist=one, flip_tta=True)
    with torch.no_grad():
        logits = torch.cat([(model(x) + model(x.flip(3))) / 2 for x, _ in batches])
    labels = torch.cat([y for _, y in batches])
    assert tta["samples"] == plain["samples"] == 24
    assert tta["top1"] == pytest.approx(100 * (logits.argmax(1) == labels).float().mean().item())
    assert tta["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), rel=1e-5)
    assert tta["loss"] != pytest.approx(plain["loss"], rel=1e-3)
    # the unflipped pass alone, as the leaderboards' rules (no TTA) count it; None without the flip
    assert tta["top1_no_tta"] == plain["top1"] and plain["top1_no_tta"] is None

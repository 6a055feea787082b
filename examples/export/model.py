"""The worked example's model: a small CNN that tells in which quadrant of a 16x16
image a bright blob sits, and the data it learns from (made here, nothing downloaded).

``export_example()`` is the hook ``torch-pjrt export`` calls: the model (with the weights
train_and_export.py saved, when there are some: out/classifier.pt, or the file
$QUADRANT_WEIGHTS names) and an example input, batch dynamic."""

from __future__ import annotations

import os
from pathlib import Path

import torch

WEIGHTS = Path(__file__).resolve().parent / "out" / "classifier.pt"


class QuadrantNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(16 * 4 * 4, 4)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def batch(n: int, generator: torch.Generator, device="cpu"):
    """``n`` noisy 16x16 images, each with a 4x4 blob in one quadrant, and the quadrant."""
    labels = torch.randint(0, 4, (n,), generator=generator)
    images = 0.3 * torch.randn(n, 1, 16, 16, generator=generator)
    rows = (labels // 2) * 8 + torch.randint(0, 5, (n,), generator=generator)
    cols = (labels % 2) * 8 + torch.randint(0, 5, (n,), generator=generator)
    for i in range(n):
        images[i, 0, rows[i] : rows[i] + 4, cols[i] : cols[i] + 4] += 1.0
    return images.to(device), labels.to(device)


def export_example():
    from torch.export import Dim

    model = QuadrantNet()
    weights = Path(os.environ.get("QUADRANT_WEIGHTS", WEIGHTS))
    if weights.exists():
        model.load_state_dict(torch.load(weights, map_location="cpu"))
    model = model.to("pjrt").eval()
    x = torch.zeros(2, 1, 16, 16, device="pjrt")
    return model, (x,), {"x": {0: Dim("batch", max=1024)}}

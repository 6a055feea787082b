"""A small CNN with cuDNN and TF32 switches and a "cuda:0" device string."""

import torch
from torch import nn

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
device = "cuda:0"

torch.manual_seed(0)
g = torch.Generator().manual_seed(4)
images = torch.randn(8, 3, 12, 12, generator=g).to("cuda:0")
labels = torch.randint(0, 5, (8,), generator=g).to(device)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(8, 5),
).to(device)  # fmt: skip
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(5):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    opt.step()
print(f"DEVICE {next(model.parameters()).device}")
print(f"LOSS {loss.item():.6f}")

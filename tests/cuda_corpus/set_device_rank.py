"""The per-rank device idiom of launcher scripts: LOCAL_RANK, set_device, f"cuda:{rank}"."""

import os

import torch
from torch import nn

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
print(f"devices {torch.cuda.device_count()}")
torch.cuda.set_device(local_rank)
device = torch.device(f"cuda:{local_rank}")
print(f"current {torch.cuda.current_device()}")

torch.manual_seed(0)
g = torch.Generator().manual_seed(10)
x = torch.randn(16, 5, generator=g).to(device)
y = (x.sum(dim=1, keepdim=True) > 0).float()
model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
    loss.backward()
    opt.step()
if device.type == "cuda":
    torch.cuda.synchronize(device)
print(f"DEVICE {next(model.parameters()).device}")
print(f"LOSS {loss.item():.6f}")

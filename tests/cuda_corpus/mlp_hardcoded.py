"""An MLP written for a CUDA machine only: "cuda" hard-coded, .cuda(), cudnn.benchmark,
torch.cuda seeding and synchronize-based timing."""

import time

import torch
from torch import nn

device = torch.device("cuda")
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)

g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g).cuda()
y = torch.randn(64, 1, generator=g).to(device)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)

torch.cuda.synchronize()
start = time.perf_counter()
for step in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"seconds {time.perf_counter() - start:.3f}")
print(f"DEVICE {next(model.parameters()).device}")
print(f"LOSS {loss.item():.6f}")

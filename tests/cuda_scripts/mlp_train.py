"""A CUDA-style training script, unmodified: an MLP on random data."""

import time

import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
if torch.cuda.is_available():
    torch.cuda.manual_seed(0)

g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = torch.randn(64, 1, generator=g)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
if device == "cuda":
    model.cuda()
    x, y = x.cuda(), y.to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)

start = time.perf_counter()
for step in range(20):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
if device == "cuda":
    torch.cuda.synchronize()
elapsed = time.perf_counter() - start
print(f"device {next(model.parameters()).device}")
print(f"loss {loss.item():.6f}")
print(f"seconds {elapsed:.3f}")

"""CUDA mixed precision, unmodified: torch.autocast("cuda") and a GradScaler."""

import torch
from torch import nn

use_cuda = torch.cuda.is_available()
device = torch.device("cuda" if use_cuda else "cpu")
torch.manual_seed(0)
g = torch.Generator().manual_seed(2)
x = torch.randn(32, 8, generator=g).to(device)
y = torch.randn(32, 4, generator=g).to(device)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda", enabled=use_cuda)
old_scaler = torch.cuda.amp.GradScaler(enabled=use_cuda)

for step in range(5):
    opt.zero_grad()
    with torch.autocast("cuda" if use_cuda else "cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
with torch.cuda.amp.autocast(dtype=torch.bfloat16, enabled=use_cuda):
    dtype = model(x).dtype
print(f"device {next(model.parameters()).device}")
print(f"autocast dtype {dtype}")
print(f"scale {scaler.get_scale()} {old_scaler.is_enabled()}")
print(f"loss {loss.item():.6f}")

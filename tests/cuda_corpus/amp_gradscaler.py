"""Mixed precision the deprecated way: torch.cuda.amp.autocast and torch.cuda.amp.GradScaler."""

import torch
from torch import nn
from torch.cuda.amp import GradScaler, autocast

use_cuda = torch.cuda.is_available()
device = "cuda" if use_cuda else "cpu"
torch.manual_seed(0)
g = torch.Generator().manual_seed(2)
x = torch.randn(32, 8, generator=g).to(device)
y = torch.randn(32, 4, generator=g).to(device)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = GradScaler(enabled=use_cuda)

for step in range(5):
    opt.zero_grad()
    with autocast(dtype=torch.bfloat16):
        out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
print(f"DEVICE {next(model.parameters()).device}")
print(f"LOSS {loss.item():.6f}")

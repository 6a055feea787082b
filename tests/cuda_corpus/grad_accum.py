"""Gradient accumulation, clipping and a schedule; memory figures when on CUDA."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
g = torch.Generator().manual_seed(9)
x = torch.randn(4, 16, 10, generator=g)
y = torch.randn(4, 16, 1, generator=g)
model = nn.Sequential(nn.Linear(10, 20), nn.SiLU(), nn.Linear(20, 1)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
if torch.cuda.is_available():
    torch.cuda.reset_peak_memory_stats()
for epoch in range(3):
    opt.zero_grad()
    for micro in range(4):
        xb, yb = x[micro].to(device), y[micro].to(device)
        loss = nn.functional.mse_loss(model(xb), yb) / 4
        loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
if torch.cuda.is_available():
    print(f"peak_bytes {torch.cuda.max_memory_allocated()}")
    torch.cuda.empty_cache()
print(f"DEVICE {next(model.parameters()).device}")
print(f"LOSS {loss.item() * 4:.6f}")

"""A DataLoader with pinned memory and non-blocking copies; the loss logged every step."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(5)
data = TensorDataset(torch.randn(48, 6, generator=g), torch.randn(48, 1, generator=g))
loader = DataLoader(data, batch_size=16, shuffle=False, pin_memory=True)
model = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(2):
    for xb, yb in loader:
        xb = xb.cuda(non_blocking=True)
        yb = yb.cuda(non_blocking=True)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
print(f"DEVICE {next(model.parameters()).device}")
print(f"LOSS {loss.item():.6f}")

"""An autoencoder trained with torch.autocast("cuda") and torch.amp.GradScaler("cuda"),
then run under inference_mode."""

import torch
from torch import nn

use_cuda = torch.cuda.is_available()
device = "cuda" if use_cuda else "cpu"
torch.backends.cudnn.enabled = True
torch.manual_seed(0)
g = torch.Generator().manual_seed(11)
x = torch.randn(24, 12, generator=g).to(device)
model = nn.Sequential(nn.Linear(12, 4), nn.Tanh(), nn.Linear(4, 12)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cuda", enabled=use_cuda)
for step in range(4):
    opt.zero_grad()
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), x)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
model.eval()
with torch.inference_mode(), torch.autocast(device_type="cuda", dtype=torch.bfloat16,
                                            enabled=use_cuda):  # fmt: skip
    recon = model(x)
print(f"DEVICE {recon.device}")
print(f"LOSS {loss.item():.6f}")

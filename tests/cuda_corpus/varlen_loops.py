"""Sequence code with habits that are slow on XLA devices: per-element loops, slices
that grow every step, float64 metrics. Runs on CUDA as written."""

import torch
from torch import nn

torch.manual_seed(0)
g = torch.Generator().manual_seed(12)
seq = torch.randn(6, 8, 4, generator=g).cuda()
target = torch.randn(6, 1, generator=g).cuda()
rnn = nn.GRU(4, 8, batch_first=True).cuda()
head = nn.Linear(8, 1).cuda()
params = list(rnn.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=0.05)
for step in range(1, 5):
    opt.zero_grad()
    out, _ = rnn(seq[:, : step + 4])
    pred = head(out[:, -1])
    loss = nn.functional.mse_loss(pred, target)
    loss.backward()
    opt.step()
norms = torch.zeros(seq.shape[0])
for i in range(seq.shape[0]):
    norms[i] = seq[i].norm().cpu()
error = (pred - target).detach().cpu().double().abs().mean()
print(f"error {float(error):.6f} norms {float(norms.sum()):.4f}")
print(f"DEVICE {pred.device}")
print(f"LOSS {loss.item():.6f}")

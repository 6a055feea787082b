"""A tiny Transformer encoder trained on CUDA: nn.MultiheadAttention head sizes and
per-step logging of the loss."""

import torch
from torch import nn

D_MODEL = 96
N_HEADS = 3
HEAD_DIM = D_MODEL // N_HEADS


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(D_MODEL, N_HEADS, batch_first=True)
        self.layer = nn.TransformerEncoderLayer(d_model=96, nhead=3, dropout=0.0,
                                                batch_first=True)  # fmt: skip
        self.out = nn.Linear(D_MODEL, 1)

    def forward(self, x):
        h, _ = self.attn(x, x, x, need_weights=False)
        return self.out(self.layer(h)).mean(dim=1)


torch.manual_seed(0)
g = torch.Generator().manual_seed(8)
x = torch.randn(4, 6, D_MODEL, generator=g).cuda()
y = torch.randn(4, 1, generator=g).cuda()
model = Tiny().cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(4):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(loss)
    losses = loss.item()
torch.cuda.synchronize()
print(f"DEVICE {next(model.parameters()).device}")
print(f"LOSS {loss.item():.6f}")

"""A CUDA-graphs training loop, unmodified: warm up on a side stream, capture one step
with torch.cuda.graph, replay it on new batches (on a machine without CUDA: a plain loop)."""

import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(8)]
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=0.01, capturable=device == "cuda")
static_x = torch.zeros(8, 16, device=device)
static_y = torch.zeros(8, 1, device=device)


def step():
    loss = nn.functional.mse_loss(model(static_x), static_y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


losses = []
static_x.copy_(batches[0][0])
static_y.copy_(batches[0][1])
if device == "cuda":
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: the optimizer makes its state
        losses.append(step().item())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
else:
    losses.append(step().item())
for x, y in batches[1:]:
    static_x.copy_(x)
    static_y.copy_(y)
    if device == "cuda":
        graph.replay()
        losses.append(static_loss.item())
    else:
        losses.append(step().item())
print(f"device {static_x.device}")
print(f"loss {losses[-1]:.6f}")
print(f"losses {len(losses)}")

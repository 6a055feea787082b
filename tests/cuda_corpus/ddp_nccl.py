"""DistributedDataParallel on the "nccl" backend, one process (world size 1)."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29541")
os.environ["NCCL_DEBUG"] = "WARN"
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.set_device(local_rank)

torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
x = torch.randn(32, 8, generator=g).cuda(local_rank)
y = torch.randn(32, 2, generator=g).cuda(local_rank)
ids = [local_rank] if torch.cuda.is_available() else None
model = DDP(nn.Linear(8, 2).cuda(local_rank), device_ids=ids)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print(f"DEVICE {x.device}")
print(f"LOSS {loss.item():.6f}")
dist.destroy_process_group()

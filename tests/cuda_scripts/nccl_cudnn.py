"""torch.distributed with the "nccl" backend (one process) and cudnn flags."""

import os

import torch
import torch.distributed as dist

torch.backends.cudnn.deterministic = True
torch.backends.cudnn.enabled = True
backend = "nccl" if torch.cuda.is_available() else "gloo"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", os.environ.get("TEST_PORT", "29517"))
dist.init_process_group(backend, rank=0, world_size=1)
device = "cuda:0" if torch.cuda.is_available() else "cpu"
t = torch.arange(4.0, device=device)
dist.all_reduce(t)
print(f"backend {dist.get_backend()}")
print(f"device {t.device}")
print(f"sum {t.sum().item()}")
dist.destroy_process_group()

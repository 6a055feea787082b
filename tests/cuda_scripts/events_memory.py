"""CUDA events, memory statistics, "cuda:0" strings and torch.device("cuda")."""

import torch

if not torch.cuda.is_available():
    print("device cpu")
    raise SystemExit(0)

print(f"devices {torch.cuda.device_count()} current {torch.cuda.current_device()}")
print(f"name {torch.cuda.get_device_name(0)}")
torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_allocated()
start = torch.cuda.Event(enable_timing=True)
end = torch.cuda.Event(enable_timing=True)
start.record()
a = torch.randn(256, 256, device="cuda:0")
b = torch.ones(256, 256, device=torch.device("cuda"))
c = (a @ b).sum()
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end)
print(f"device {a.device} {b.device}")
print(f"is_cuda {a.is_cuda}")
print(f"elapsed_ms_positive {ms > 0}")
print(f"allocated_grew {torch.cuda.memory_allocated() >= before}")
print(f"peak {torch.cuda.max_memory_allocated() >= 0}")
stats = torch.cuda.memory_stats()
print(f"stats {'allocated_bytes.all.current' in stats}")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    d = c * 2
s.synchronize()
print(f"value {torch.allclose(d.cpu(), 2 * (a.cpu() @ b.cpu()).sum())}")
torch.cuda.empty_cache()

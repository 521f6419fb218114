"""A noisy neighbour: 8192^2 bf16 matmuls back to back (synchronising every 4), until killed."""

import torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    for _ in range(4):
        c = a @ b
    torch.cuda.synchronize()

"""An idle sibling: holds a CUDA context (under the shim) and sleeps until killed."""

import time

import torch

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)

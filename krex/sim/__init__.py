"""The simulated GPU's Python side: its driver through ctypes (simgpu) and its shared node
(simnode). Used by the daemon, tenants and benchmarks on machines without a GPU; above core."""

"""What every KREX process shares: errors, the wire's framing, configuration, trust checks,
the shared-memory layout, paths, processes, cgroups (tenants), the CPU slice arithmetic, the
build's identity, the daemon's liveness lock and NVML. It imports nothing of krex above it
(tests/test_layers.py)."""

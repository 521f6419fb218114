"""Benchmark support for `krex bench`: the workload suite's metrics."""

"""Benchmark support for `krex bench`: the workload suite's metrics."""

# The krex-settle mode's default `krex run --settle` (docs/bench.md); here,
# where the CLI reads it without importing the runner.
SETTLE_S = 0.4

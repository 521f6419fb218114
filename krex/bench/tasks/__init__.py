"""The agent-style benchmarking commands of the real-GPU suites (see krex/bench/suite.py).

Each module is a standalone script, `python TASK.py VARIANT [--seed N]`, written the way agents
write them; `_harness.run` holds the part they all share (seed, compile, check, time, print).
"""

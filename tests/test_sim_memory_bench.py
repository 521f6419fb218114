"""scripts/bench/sim_memory.py's agents (`--agents`), without running a mode: whose candidate is
which, what it needs and where it is written (the runs themselves are for docs/results/)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import load_script

MIB = 1 << 20


@pytest.fixture
def sm() -> Any:
    return load_script("scripts/bench/sim_memory.py")


def test_an_agents_candidates_share_its_problem_and_vary_its_workspace(sm: Any) -> None:
    capacity = 4096 * MIB
    problems = sm.mix(4, capacity)
    cands = sm.agents_mix(32, 4, capacity)
    assert len(cands) == 32 and cands == sm.agents_mix(32, 4, capacity)  # one fixed draw
    for i, (inp, ws) in enumerate(cands):
        p_inp, p_ws = problems[i % 4]
        assert inp == p_inp  # the agent's problem: its input
        assert 0.8 * p_ws - 1 <= ws <= 1.2 * p_ws + 1  # a candidate's own workspace
    assert len({ws for _, ws in cands[0::4]}) > 1  # candidates differ
    script = sm.memory_check.agent_script
    assert script(5, "same") == script(9, "same") == "bench.py"
    assert script(5, "new") != script(9, "new")

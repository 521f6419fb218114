"""The session's clean-up of group roots (tests/conftest.py, pytest_sessionfinish) leaves the
roots of another pytest session on the machine alone (a CI run beside a developer's)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import _test_process_lives


def test_a_test_root_of_a_live_process_is_another_sessions() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _test_process_lives(f"krex-test-{other.pid}-3")
    finally:
        other.kill()
        other.wait()
    assert not _test_process_lives(f"krex-test-{os.getpid()}-3")  # a session without workers
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not _test_process_lives(f"krex-test-{gone.pid}-3")  # its session has ended
    # Not a test's Env root: decided elsewhere (a daemon's root by its segment's lock).
    assert not _test_process_lives("krex-test-acct")
    assert not _test_process_lives(f"krex-{os.getpid()}")

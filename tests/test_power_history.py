"""The mean power before a grant (krex/daemon/fidelity.py's PowerHistory), from energy samples."""

from __future__ import annotations

from krex.daemon.fidelity import HISTORY_S, PowerHistory


def test_mean_power_over_the_window_before_now() -> None:
    h = PowerHistory()
    for t in range(21):  # 300 W for 20 s: 300 J a second
        h.note(0, float(t), 300_000 * t)
    mean = h.mean_w(0, 20.0, 300_000 * 20)
    assert mean is not None and abs(mean - 300.0) < 1e-6
    # The sample nearest HISTORY_S before is used: 500 W in the last 10 s reads as 500.
    h2 = PowerHistory()
    for t in range(11):
        h2.note(0, float(t), 100_000 * t)
    for t in range(11, 21):
        h2.note(0, float(t), 1_000_000 + 500_000 * (t - 10))
    m2 = h2.mean_w(0, 20.0, 1_000_000 + 500_000 * 10)
    assert m2 is not None and abs(m2 - 500.0) < 1e-6
    assert HISTORY_S == 10.0


def test_no_mean_without_enough_history_or_on_a_counter_that_went_back() -> None:
    h = PowerHistory()
    assert h.mean_w(0, 5.0, 1000) is None
    h.note(0, 3.0, 1000)
    assert h.mean_w(0, 5.0, 2000) is None  # 2 s of history: under half the window
    h.note(0, 0.0, 5000)
    assert h.mean_w(1, 10.0, 9000) is None  # another GPU
    assert h.mean_w(0, 10.0, 100) is None  # the counter went back (a driver reload)


def test_old_samples_are_dropped() -> None:
    h = PowerHistory()
    for t in range(100):
        h.note(0, float(t), t)
    assert len(h._samples[0]) <= 31

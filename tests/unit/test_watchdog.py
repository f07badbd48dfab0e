"""The worker's watchdog on the user's code (smlt/runtime/train/watchdog.py): a call far past the
job's measured steps is stopped where it is; a slow but progressing one never is."""

import signal
import time

import pytest

from smlt.runtime.train import watchdog
from smlt.runtime.train.watchdog import RECORD_RESERVE_S, Stalled, Watchdog


def test_the_limit_is_a_wide_margin_over_the_measured_steps():
    assert Watchdog(None, per_row_s=0.001 / 32).limit_s(32) == watchdog.MIN_STALL_S  # a fast step: the floor
    assert Watchdog(None, per_row_s=1.0).limit_s(32) == pytest.approx(20 * 32.0)  # a 32 s step: 640 s
    assert Watchdog(None, per_row_s=None).limit_s(32) is None  # nothing measured, no deadline: none
    assert Watchdog(None, per_row_s=1.0, enabled=False).limit_s(32) is None  # a built-in model: none
    # Nothing measured yet (round 0's first step): the invocation's end, less the time to record.
    left = Watchdog(time.monotonic() + 100, per_row_s=None).limit_s(32)
    assert left == pytest.approx(100 - RECORD_RESERVE_S, abs=0.5)
    # A margin past the invocation's end: never stopped (Lambda's timeout ends it, as before).
    assert Watchdog(time.monotonic() + 100, per_row_s=1.0).limit_s(32) is None


def test_a_slow_but_progressing_step_is_never_stopped_a_hung_one_is(monkeypatch):
    monkeypatch.setattr(watchdog, "MIN_STALL_S", 0.2)
    dog = Watchdog(None, per_row_s=0.001)
    outer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's own, when it runs
    with dog.call(rows=1, train=True) as limit:
        assert limit == 0.2
        time.sleep(0.1)  # 100x the step measured before, within the floor
    assert dog.per_row_s == pytest.approx(0.1, rel=0.5)  # the slowest step measured so far
    assert dog.per_row_s is not None
    with dog.call(rows=1, train=True) as limit:
        assert limit == pytest.approx(20 * dog.per_row_s)
        time.sleep(0.4)  # 4x slower again: progressing, within 20x
    t0 = time.monotonic()
    with pytest.raises(Stalled), dog.call(rows=1, train=False):
        time.sleep(3600)  # hung
    assert time.monotonic() - t0 < 20 * 0.6
    due, _ = signal.getitimer(signal.ITIMER_REAL)
    assert due == 0.0 if outer[0] == 0.0 else 0 < due <= outer[0]  # none left behind, another kept


def test_a_timer_already_set_is_kept(monkeypatch):
    monkeypatch.setattr(watchdog, "MIN_STALL_S", 0.2)
    before = signal.signal(signal.SIGALRM, lambda *a: None)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        with pytest.raises(Stalled), Watchdog(None, per_row_s=0.001).call(rows=1, train=True):
            time.sleep(5)
        due, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 99 < due <= 100  # set again, less the time spent
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)

"""The C client's redundancy controller (clients/c/src/link.c) against relay_core's
(relay_core/redundancy.pyx, docs/PROTOCOL.md 14.5): the same judgements, RTT samples and clock
through both, step for step, give the same estimates and the same mode. The policy is a local
choice, but every implementation is to read a path the way the spec says."""
from __future__ import annotations

import ctypes
import random

import pytest

from relay_core.redundancy import MODE_NAMES, LinkModel


class Link(ctypes.Structure):
    """rc_link (clients/c/src/link.h), field for field."""
    _fields_ = [
        ("loss", ctypes.c_double), ("loss_after_loss", ctypes.c_double),
        ("previous_lost", ctypes.c_int), ("judged", ctypes.c_uint32),
        ("judged_after_loss", ctypes.c_uint32), ("since_loss", ctypes.c_uint32),
        ("min_rtt", ctypes.c_double), ("window_min", ctypes.c_double),
        ("window_start", ctypes.c_double), ("queue_delay", ctypes.c_double),
        ("high_samples", ctypes.c_int), ("congested_until", ctypes.c_double),
        ("congestion_episodes", ctypes.c_uint64), ("mode", ctypes.c_int),
        ("loss_memory", ctypes.c_uint32), ("burst_threshold", ctypes.c_double),
        ("congestion_delay", ctypes.c_double), ("congestion_hold", ctypes.c_double),
        ("min_rtt_window", ctypes.c_double),
    ]


@pytest.fixture(scope="module")
def lib(c_build):
    lib = ctypes.CDLL(str(c_build / "librelay_client_testing.so"))
    link = ctypes.POINTER(Link)
    lib.rc_link_init.argtypes = [link, ctypes.c_uint32] + [ctypes.c_double] * 5
    lib.rc_link_judged.argtypes = [link, ctypes.c_int]
    lib.rc_link_rtt.argtypes = [link, ctypes.c_double, ctypes.c_double, ctypes.c_double]
    lib.rc_link_update.argtypes = [link, ctypes.c_double]
    lib.rc_link_update.restype = ctypes.c_int
    lib.rc_link_burst_length.argtypes = [link]
    lib.rc_link_burst_length.restype = ctypes.c_double
    return lib


SETTINGS = [
    # loss_memory, burst_threshold, congestion_delay, congestion_hold, min_rtt_window
    (128, 0.2, 0.05, 5.0, 10.0),
    (16, 0.1, 0.02, 1.0, 2.0),
    (1, 0.5, 0.2, 0.5, 0.5),
]


def same(c_value: float, py_value: float) -> bool:
    return c_value == pytest.approx(py_value, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_c_controller_matches_relay_core_step_for_step(lib, settings, seed):
    rng = random.Random(seed)
    c_link = Link()
    lib.rc_link_init(ctypes.byref(c_link), *settings, 0.0)
    model = LinkModel(*settings, now=0.0)
    now, srtt, floor = 0.0, 0.05, 0.04
    in_burst = False
    modes = set()
    for step in range(6000):
        now += rng.uniform(0.0, 0.05)
        if rng.random() < 0.002:
            floor = rng.choice([0.01, 0.04, 0.2, 0.35])            # a new route
        roll = rng.random()
        if roll < 0.6:
            # Losses now independent, now in runs, now none for a while.
            phase = (step // 1500) % 3
            if phase == 0:
                lost = rng.random() < 0.1
            elif phase == 1:
                in_burst = rng.random() < (0.7 if in_burst else 0.04)
                lost = in_burst
            else:
                lost = rng.random() < 0.002
            lib.rc_link_judged(ctypes.byref(c_link), int(lost))
            model.judged(lost)
        elif roll < 0.95:
            queue = rng.uniform(0.0, 0.3) if (step // 700) % 4 == 3 else 0.0
            sample = round(floor + queue + rng.uniform(0.0, 0.02), 3)
            srtt += (sample - srtt) * 0.125
            lib.rc_link_rtt(ctypes.byref(c_link), sample, srtt, now)
            model.rtt(sample, srtt, now)
        mode = lib.rc_link_update(ctypes.byref(c_link), now)
        assert MODE_NAMES[mode] == model.update(now), step
        modes.add(MODE_NAMES[mode])
        assert same(c_link.loss, model.loss), step
        assert same(c_link.loss_after_loss, model.loss_after_loss), step
        assert same(lib.rc_link_burst_length(ctypes.byref(c_link)), model.burst_length), step
        assert same(c_link.min_rtt, model.min_rtt), step
        assert same(c_link.queue_delay, model.queue_delay), step
    # The walk went through every mode, so the comparison covered the rules between them.
    assert modes == set(MODE_NAMES), modes

"""The stream timing's check that every call was queued while the GPU slept (``harness.time_cuda``), on a simulated
GPU: a clock that the host's work advances, a sleep that ends at a set time, kernels that run once queued and
awake. No CUDA is needed; the simulation stands in for ``torch.cuda``'s events, sleep and synchronize."""
from types import SimpleNamespace

import pytest

from fastnf4.bench import harness


class FakeGPU:
    """One stream. ``host_cost(i)`` is the host time (s) of the i-th call made; each call queues a kernel of
    ``kernel_s``. The GPU runs a queued item at max(its queue time, the end of the previous item)."""

    def __init__(self, monkeypatch, host_cost, kernel_s=30e-6):
        self.now, self.gpu_free, self.calls, self.sleeps = 0.0, 0.0, 0, []
        self.host_cost, self.kernel_s = host_cost, kernel_s
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = max(gpu.now, gpu.gpu_free)  # an event completes when the stream reaches it
                gpu.gpu_free = self.at

            def query(self):
                return self.at <= gpu.now

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3  # ms

        monkeypatch.setattr(harness.torch.cuda, "Event", Event)
        monkeypatch.setattr(harness.torch.cuda, "_sleep", self.sleep)
        monkeypatch.setattr(harness.torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(harness, "time", SimpleNamespace(perf_counter=lambda: gpu.now))

    def sleep(self, cycles):
        self.sleeps.append(cycles)
        self.gpu_free = max(self.now, self.gpu_free) + cycles / 2e9

    def synchronize(self):
        self.now = max(self.now, self.gpu_free)

    def call(self):
        self.now += self.host_cost(self.calls)
        self.calls += 1
        self.gpu_free = max(self.now, self.gpu_free) + self.kernel_s


def test_a_steady_host_is_queued_ahead_and_times_the_kernel(monkeypatch):
    gpu = FakeGPU(monkeypatch, host_cost=lambda i: 100e-6)
    t = harness.time_cuda([gpu.call], iters=20, warmup=3)
    assert t["queued_ahead"] and len(gpu.sleeps) == 1
    assert t["median_us"] == pytest.approx(30.0)


def test_a_host_slower_than_its_warm_up_is_timed_again_with_a_longer_sleep(monkeypatch):
    # warm-up calls (6 of them) cost 100 us; the first timed pass 2 ms a call, so the GPU wakes while the host is
    # still queueing and the events hold host time; the second pass is steady again
    gpu = FakeGPU(monkeypatch, host_cost=lambda i: 2e-3 if 6 <= i < 26 else 100e-6)
    t = harness.time_cuda([gpu.call], iters=20, warmup=3)
    assert len(gpu.sleeps) == 2 and gpu.sleeps[1] > 3 * gpu.sleeps[0]
    assert t["queued_ahead"]
    assert t["median_us"] == pytest.approx(30.0)


def test_a_host_that_stays_slow_is_reported(monkeypatch):
    gpu = FakeGPU(monkeypatch, host_cost=lambda i: 100e-6 if i < 6 else 1.0)
    t = harness.time_cuda([gpu.call], iters=5, warmup=3, tries=2)
    assert len(gpu.sleeps) == 2 and not t["queued_ahead"]
    assert t["median_us"] > 1e5  # the events held the host's gaps: what the flag warns of

"""The host update thread's jobs in the trace (runtime/carried_updates.HostJob): their span
ends when the job ended, not when the program waited for it, also where the trace learns of
the job after it ended (on CUDA the step's records are emitted at its end)."""

from __future__ import annotations

import time

from ratrain.runtime.carried_updates import HostUpdates
from ratrain.runtime.trace import Tracer


class _SlowNorm:
    def sq_norm(self):
        time.sleep(0.05)
        return 1.0


def test_a_host_jobs_span_ends_when_the_job_did():
    tracer, host = Tracer(), HostUpdates()
    tracer.begin_step(0)
    t0 = time.perf_counter()
    job = host.start_norm(0, _SlowNorm())
    tracer.start_async("SN0", t0, job)  # registered while it runs
    assert host.wait_norm(0) == 1.0
    late = host.start_norm(1, _SlowNorm())
    late.result()
    time.sleep(0.1)
    tracer.start_async("SN1", time.perf_counter() - 0.2, late)  # registered after it ended
    time.sleep(0.1)
    tracer.end_async("SN0", time.perf_counter())  # the walker's wait, later: changes nothing
    tracer.end_async("SN1", time.perf_counter())
    spans = {name: (start, end) for _, name, start, end in tracer.async_spans()}
    sn0, sn1 = spans["SN0"], spans["SN1"]
    assert 0.045e6 <= sn0[1] - sn0[0] < 0.1e6
    assert sn1[1] < tracer._us(time.perf_counter()) - 0.15e6  # its end, not the wait's

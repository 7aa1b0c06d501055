"""CUDA-event timing shared by the scripts that time through torch (varlen_bench,
variant_bench): back-to-back calls between two events, median of batches."""
from __future__ import annotations

import statistics


def time_ms(fn, reps: int = 10, batches: int = 5, warmup: int = 2) -> float:
    """Milliseconds per call of ``fn``: ``warmup`` calls, then ``batches`` batches of
    ``reps`` back-to-back calls between two CUDA events on torch's current stream; the
    median batch."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)

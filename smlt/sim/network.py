"""A Lambda function's network in the simulated world: a token bucket, the same at every memory size.

../shared/facts.md (Skyrise, arXiv 2501.07771, measured on AWS): a function's transfers burst to
~1.2 GiB/s for ~250 ms (a ~300 MiB bucket), then hold ~75 MiB/s, whatever its memory. As a token
bucket: tokens (MB) arrive at the sustained rate and fill the bucket up to its size; a transfer
runs at the burst rate while tokens last (draining them at burst - sustained), then at the
sustained rate. The rate a drained bucket refills at is the sustained rate: that is what a token
bucket's rate after its burst is (Firecracker's rate limiter, which Lambda's microVMs run on, has
one refill rate). So an idle function - a warm one between rounds, a worker while it computes -
gets its burst back at ~75 MiB/s (a full bucket in about 4 s).

The constants are the world's (`World.draw`, drawn per scenario-seed around the published
figures); nothing here is the planner's. numpy-friendly: every argument may be an array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIB = 1024**2 / 1e6  # MB per MiB
GIB = 1024**3 / 1e6  # MB per GiB


@dataclass(frozen=True)
class Link:
    burst_mbps: float  # MB/s while tokens last
    sustained_mbps: float  # MB/s once the bucket is empty; also the refill rate
    bucket_mb: float  # the bucket's size in tokens (MB)

    def transfer(self, mb, tokens, scale=1.0):
        """Seconds to move `mb` starting with `tokens` in the bucket, and the tokens left after.
        `scale` multiplies both rates (this transfer's network weather)."""
        if isinstance(mb, float | int) and isinstance(tokens, float | int) and isinstance(scale, float | int):
            return self._transfer_one(float(mb), float(tokens), float(scale))
        mb = np.asarray(mb, dtype=float)
        tokens = np.clip(np.asarray(tokens, dtype=float), 0.0, self.bucket_mb)
        burst = self.burst_mbps * np.asarray(scale, dtype=float)
        sustained = self.sustained_mbps * np.asarray(scale, dtype=float)
        drain = np.maximum(burst - sustained, 1e-9)
        burst_s = tokens / drain  # how long the tokens carry the burst rate
        burst_mb = burst * burst_s
        within = mb <= burst_mb
        seconds = np.where(within, mb / burst, burst_s + (mb - burst_mb) / sustained)
        left = np.where(within, tokens - drain * mb / burst, 0.0)
        return _out(seconds), _out(left)

    def _transfer_one(self, mb: float, tokens: float, scale: float) -> tuple[float, float]:
        """`transfer` of one worker's numbers in plain floats: the same operations in the same
        order (so the same results), without numpy's cost on scalars (the simulator's hot path)."""
        tokens = min(max(tokens, 0.0), self.bucket_mb)
        burst = self.burst_mbps * scale
        sustained = self.sustained_mbps * scale
        drain = max(burst - sustained, 1e-9)
        burst_s = tokens / drain
        burst_mb = burst * burst_s
        if mb <= burst_mb:
            return mb / burst, tokens - drain * mb / burst
        return burst_s + (mb - burst_mb) / sustained, 0.0

    def refill(self, tokens, idle_s):
        """The tokens after `idle_s` seconds without a transfer."""
        if isinstance(tokens, float | int) and isinstance(idle_s, float | int):
            return min(self.bucket_mb, float(tokens) + self.sustained_mbps * max(float(idle_s), 0.0))
        idle = np.maximum(np.asarray(idle_s, dtype=float), 0.0)
        return _out(np.minimum(self.bucket_mb, np.asarray(tokens, dtype=float) + self.sustained_mbps * idle))


def _out(a):
    return float(a) if np.ndim(a) == 0 else a

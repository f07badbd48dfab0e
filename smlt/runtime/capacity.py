"""What a worker of m MB has and what training needs of it: Lambda's vCPU share, the torch threads
a worker runs, and the memory a model's training takes.

One source for the worker (its thread count and its ModelTooLarge check), the planner (its speed
prior and its usable tiers) and the simulator's world.
"""

from __future__ import annotations

import math
import os

import numpy as np

# facts.md: 1 vCPU at 1,769 MB, about 6 vCPUs at 10,240 MB. Below 1,769 MB a function gets a
# proportional share of one vCPU; above it the share grows linearly to 6 at 10,240 MB.
FULL_VCPU_MB = 1769.0
MAX_MB = 10240.0
MAX_VCPU = 6.0


def vcpus(memory_mb):
    """Lambda's vCPU share at `memory_mb` (fractional; an array for an array)."""
    m = np.asarray(memory_mb, dtype=float)
    return np.where(
        m <= FULL_VCPU_MB, m / FULL_VCPU_MB, 1.0 + (MAX_VCPU - 1.0) * (m - FULL_VCPU_MB) / (MAX_MB - FULL_VCPU_MB)
    )


def torch_threads(memory_mb: float, cores: int | None = None) -> int:
    """The worker's torch threads: every vCPU it pays for, a fractional one included (3,008 MB is
    1.7 vCPUs: two threads), never more than the machine's cores."""
    share = math.ceil(float(vcpus(memory_mb)) - 1e-9)
    return max(1, min(cores or os.cpu_count() or 1, share))


def speed(memory_mb, efficiency):
    """Compute speed relative to one thread on a full vCPU: the vCPU share below one vCPU; above
    it the worker's threads (`torch_threads`) use the whole share, and every vCPU beyond the first
    adds `efficiency` of one (intra-op parallelism of small models is poor)."""
    v = vcpus(memory_mb)
    return np.where(v <= 1.0, v, 1.0 + np.asarray(efficiency, dtype=float) * (v - 1.0))


# --- Memory need ----------------------------------------------------------------------------
RUNTIME_MB = 450.0  # Python + torch + the handler
PARAM_COPIES = 6  # weights, gradients, two optimizer buffers, the global copy, the delta
BYTES_PER_VALUE = 4  # float32


def memory_needed_mb(params: int, *, data_bytes: float = 0.0, activation_mb: float = 0.0) -> float:
    """MB a worker needs to train a model of `params` parameters: ~6 float32 copies of them, the
    dataset bytes it holds at once (`data_bytes`: the shard in use and the next, twice while
    parsed), the activations a batch keeps for the backward pass, and the runtime."""
    return (PARAM_COPIES * BYTES_PER_VALUE * params + data_bytes) / 2**20 + activation_mb + RUNTIME_MB


def shard_bytes_held(largest_shard_bytes: float) -> float:
    """The dataset bytes a worker holds at once: the shard in use and the next one (twice while
    it is parsed)."""
    return 3.0 * largest_shard_bytes

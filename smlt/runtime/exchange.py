"""Per-step synchronous mode: gradients averaged among the workers at every step, through a store.

`ReduceScatter` averages one gradient per worker per step, as SMLT does: each of n workers writes
its gradient (one object), reduces its 1/n slice of all gradients (ranged GETs), writes the
averaged slice, then reads all averaged slices. Every wait is a bounded polling barrier
(`wait_get`) that raises `BarrierTimeout` naming the missing key. The aggregator deletes a
round's exchange objects (`delete_prefix` of `keys.sync_prefix`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from smlt.runtime.aggregate.reduce import weighted_sum_into
from smlt.runtime.store.base import NotFound, ObjectStore
from smlt.runtime.store.parallel import FETCH_THREADS, ordered_map
from smlt.runtime.tensors.codec import ST_DTYPE, encode_array
from smlt.runtime.tensors.dtypes import ST_TO_NP, to_float32
from smlt.runtime.tensors.format import header_length, save_raw, views
from smlt.runtime.tensors.layout import slice_bounds


class BarrierTimeout(TimeoutError):
    """A per-step barrier waited longer than its timeout for another worker's object."""


@dataclass(frozen=True)
class Poll:
    """Polling schedule of a barrier: first wait, growth factor, longest wait, total timeout (s)."""

    first: float = 0.002
    factor: float = 1.5
    longest: float = 0.1
    timeout: float = 120.0


def wait_get(
    store: ObjectStore,
    key: str,
    poll: Poll = Poll(),
    byte_range: tuple[int, int] | None = None,
    deadline: float | None = None,
) -> bytes:
    """GET (or ranged GET) key, polling with backoff until it exists; BarrierTimeout past the deadline."""
    deadline = deadline if deadline is not None else time.monotonic() + poll.timeout
    delay = poll.first
    while True:
        try:
            if byte_range is None:
                return store.get(key)
            return store.get_range(key, *byte_range)
        except NotFound:
            pass
        now = time.monotonic()
        if now >= deadline:
            raise BarrierTimeout(f"timed out waiting for {key}")
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * poll.factor, poll.longest)


class ReduceScatter:
    """Per-step gradient averaging among n workers through a store (reduce-scatter + all-gather).

    Worker i, at step s, with its flat gradient g (float32, numel elements) and weight w:
      1. writes ONE object {prefix}{s}/grad/{i}: for each slice j, a float32 weight w followed by
         g[slice j] (in the codec's dtype). Its header is the same for every worker, so a reader
         knows every byte offset without reading it.
      2. reduces slice i: one ranged GET of slice i (with its weight) from each worker's object,
         weighted mean, written as {prefix}{s}/avg/{i}.
      3. reads all n averaged slices (n GETs) into the averaged gradient, which it returns.
    Traffic per worker per step: about P (1 + 1/n) bytes out and 2 P bytes in, whatever n is.
    Keys are per (step, worker), written first-writer-wins; each wait polls with `poll`.
    After finishing step s a worker deletes its own step s-1 objects (nobody can need them then:
    every worker has written its step s gradient, so has read all of step s-1).
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        n_workers: int,
        worker: int,
        numel: int,
        *,
        codec: str = "none",
        poll: Poll = Poll(),
        cleanup: bool = True,
        threads: int = FETCH_THREADS,
    ):
        if not 0 <= worker < n_workers:
            raise ValueError(f"worker {worker} of {n_workers}")
        self.store, self.prefix, self.n, self.worker = store, prefix, n_workers, worker
        self.numel, self.codec, self.poll, self.cleanup = numel, codec, poll, cleanup
        self.threads = max(1, min(threads, n_workers))
        self.bounds = slice_bounds(numel, n_workers)
        while len(self.bounds) < n_workers:  # fewer elements than workers: empty slices
            self.bounds.append((numel, numel))
        # Byte positions of (weight, slice) j inside a gradient object, from a zero gradient's header.
        self._dtype = ST_TO_NP[ST_DTYPE[codec]]
        blob = self._grad_blob(np.zeros(numel, np.float32), 0.0)
        self._grad_size = len(blob)
        self._ranges = []
        pos = 8 + header_length(blob[:8])
        for s, e in self.bounds:
            n = 4 + (e - s) * self._dtype.itemsize
            self._ranges.append((pos, pos + n))
            pos += n

    def _grad_key(self, step: int, worker: int) -> str:
        return f"{self.prefix}{step:06d}/grad/{worker:05d}.safetensors"

    def _avg_key(self, step: int, j: int) -> str:
        return f"{self.prefix}{step:06d}/avg/{j:05d}.safetensors"

    def _grad_blob(self, grad: np.ndarray, weight: float) -> bytes:
        tensors = []
        for j, (s, e) in enumerate(self.bounds):
            tensors += [
                (f"s{j:05d}a", np.array([weight], np.float32)),
                (f"s{j:05d}b", encode_array(grad[s:e], self.codec)),
            ]
        return save_raw(tensors)

    def _reduce_my_slice(self, step: int, deadline: float) -> np.ndarray:
        """The weighted mean of slice `worker` of everyone's gradient (in worker order, so it is
        the same float32 sum on every worker)."""
        s, e = self.bounds[self.worker]
        rng = self._ranges[self.worker]
        parts = ordered_map(
            lambda i: wait_get(self.store, self._grad_key(step, i), self.poll, rng, deadline),
            list(range(self.n)),
            self.threads,
        )
        acc = np.zeros(e - s, np.float32)
        total = 0.0
        for raw in parts:
            w = float(np.frombuffer(raw[:4], np.float32)[0])
            if w:
                weighted_sum_into(acc, [to_float32(np.frombuffer(raw[4:], dtype=self._dtype))], [w])
            total += w
        if total <= 0:
            raise ValueError(f"step {step}: all weights are zero")
        np.multiply(acc, np.float32(1.0 / total), out=acc)
        return acc

    def _gather(self, step: int, deadline: float) -> np.ndarray:
        """All n averaged slices, as the averaged gradient."""
        out = np.empty(self.numel, np.float32)

        def fetch(j: int) -> np.ndarray:
            arrays, _ = views(wait_get(self.store, self._avg_key(step, j), self.poll, None, deadline))
            return to_float32(arrays["avg"])

        for (a, b), part in zip(self.bounds, ordered_map(fetch, list(range(self.n)), self.threads)):
            out[a:b] = part
        return out

    def allreduce(self, step: int, grad: np.ndarray, weight: float = 1.0) -> np.ndarray:
        """The weighted mean over all workers of their step-`step` gradients (flat float32)."""
        grad = np.asarray(grad, dtype=np.float32).reshape(-1)
        if grad.size != self.numel:
            raise ValueError(f"gradient has {grad.size} elements, expected {self.numel}")
        deadline = time.monotonic() + self.poll.timeout
        blob = self._grad_blob(grad, weight)
        assert len(blob) == self._grad_size  # every worker's object has the same byte layout
        self.store.put(self._grad_key(step, self.worker), blob, if_absent=True)
        avg = self._reduce_my_slice(step, deadline)
        self.store.put(
            self._avg_key(step, self.worker), save_raw([("avg", encode_array(avg, self.codec))]), if_absent=True
        )
        out = self._gather(step, deadline)
        if self.cleanup and step > 0:
            for key in (self._grad_key(step - 1, self.worker), self._avg_key(step - 1, self.worker)):
                self.store.delete(key)
        return out


def delete_prefix(store: ObjectStore, prefix: str) -> int:
    """Delete every key under prefix (the sync objects of a finished round); returns how many."""
    names = store.list(prefix)
    for k in names:
        store.delete(k)
    return len(names)

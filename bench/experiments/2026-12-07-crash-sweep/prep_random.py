"""`--faults crash=R` (the injector the CLI builds) on a pipeline upload: PrepareData among the
control steps it strikes; outcome and dataset against an uncrashed upload of the same data."""

from harness import World
from prep_sweep_lib import dataset

from smlt.faults import FaultInjector

w = World()
ref = dataset(w, w.version("rbase", "v1"))
for rate in (0.3, 0.6):
    for seed in (1, 2, 3):
        injector = FaultInjector.from_spec(f"crash={rate},seed={seed}", functions=w.names.train_functions)
        struck = []

        def fate(function, payload, injector=injector, struck=struck):
            f = injector(function, payload)
            if f != "ok" and isinstance(payload, dict):
                struck.append((payload.get("op", "aggregate"), f))
            return f

        pipe = f"r{int(rate * 10)}s{seed}"
        desc = w.version(pipe, "v1", fate)
        out = w.outcome(pipe, "v1", desc)
        same = desc["status"] == "SUCCEEDED" and dataset(w, desc) == ref
        print(
            rate,
            seed,
            desc["status"],
            desc.get("error"),
            struck,
            same,
            out.get("rec_status"),
            out["messages"],
            flush=True,
        )

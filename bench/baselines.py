"""Baselines for smlt's time-to-accuracy: plain single-process PyTorch and PyTorch DDP (gloo,
2 processes via torch.multiprocessing), on the same prepared dataset, model, optimizer, batch
size and target as the smlt job they are compared with.

Each run starts in a fresh process, so start-up (interpreter + torch import, loading the shards,
building the model, and for DDP the process group and the DDP wrapper) is measured apart from
training. Training time runs from the first step until an evaluation first meets the target, and
includes those evaluations: both baselines evaluate on the full validation split after every
`eval_every_samples` training samples, the samples one smlt round processes (workers x local
steps x batch), so all three evaluate equally often.

    python bench/baselines.py plain --dataset DIR --job JOB.json
    python bench/baselines.py ddp   --dataset DIR --job JOB.json
prints one JSON line. `run_baseline(kind, dataset_dir, job)` does the same from Python.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from smlt.runtime.data.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- shared pieces


def load_prepared(dataset_dir: str | Path):
    """(x_train, y_train, x_val, y_val, manifest dict) from a folder written by prepare_dataset."""
    import numpy as np
    from safetensors.numpy import load

    folder = Path(dataset_dir)
    manifest = json.loads((folder / "manifest.json").read_text())

    def split(name):
        xs, ys = [], []
        for s in manifest[name]["shards"]:
            d = load((folder / s["key"]).read_bytes())
            xs.append(d["x"])
            ys.append(d["y"])
        return np.concatenate(xs), np.concatenate(ys)

    xt, yt = split("train")
    xv, yv = split("validation")
    return xt, yt, xv, yv, manifest


def _build(job: dict, manifest: dict):
    from smlt.runtime.job import ModelSpec
    from smlt.runtime.train.models import build_model

    return build_model(
        ModelSpec(**job.get("model", {})),
        Manifest.model_validate(manifest).input_shape,
        manifest["outputs"],
        job.get("seed", 0),
    )


def _optimizer(model, t: dict):
    import torch

    opt = t.get("optimizer", "sgd")
    lr = t.get("learning_rate", 0.05)
    if opt == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=lr, momentum=t.get("momentum", 0.9), weight_decay=t.get("weight_decay", 0.0)
        )
    cls = torch.optim.Adam if opt == "adam" else torch.optim.AdamW
    return cls(model.parameters(), lr=lr, weight_decay=t.get("weight_decay", 0.0))


def eval_every_samples(job: dict) -> int:
    t, w = job.get("training", {}), job.get("workers", {})
    return int(w.get("initial", 4)) * int(t.get("local_steps", 20)) * int(t.get("batch_size", 32))


def _accuracy(model, xv, yv) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        correct = 0
        for i in range(0, len(xv), 8192):
            correct += int((model(xv[i : i + 8192]).argmax(1) == yv[i : i + 8192]).sum())
    model.train()
    return correct / len(xv)


# ----------------------------------------------------------------------------- plain PyTorch


def _plain_main(dataset: str, job: dict, t_launch: float, max_train_s: float, threads: int | None = None) -> dict:
    import numpy as np
    import torch

    if threads:
        torch.set_num_threads(threads)

    xt, yt, xv, yv, manifest = load_prepared(dataset)
    t = job["training"]
    model = _build(job, manifest)
    opt = _optimizer(model, t)
    loss_fn = torch.nn.CrossEntropyLoss()
    X, Y, XV, YV = (torch.from_numpy(a) for a in (xt, yt, xv, yv))
    b, target = int(t["batch_size"]), float(t["target_value"])
    every = max(1, eval_every_samples(job) // b)
    rng = np.random.default_rng(job.get("seed", 0))
    t_ready = time.time()
    steps, acc, curve = 0, 0.0, []
    reached = False
    while not reached and time.time() - t_ready < max_train_s:
        perm = torch.from_numpy(rng.permutation(len(xt)))
        for i in range(0, len(xt) - b + 1, b):
            idx = perm[i : i + b]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(X[idx]), Y[idx]).backward()
            opt.step()
            steps += 1
            if steps % every == 0:
                acc = _accuracy(model, XV, YV)
                curve.append((round(time.time() - t_ready, 3), steps, round(acc, 5)))
                if acc >= target:
                    reached = True
                    break
                if time.time() - t_ready > max_train_s:
                    break
    t_done = time.time()
    return {
        "kind": "plain",
        "threads": torch.get_num_threads(),
        "startup_s": t_ready - t_launch,
        "train_s": t_done - t_ready,
        "reached": reached,
        "accuracy": acc,
        "steps": steps,
        "samples": steps * b,
        "epochs": steps * b / len(xt),
        "evals": len(curve),
        "curve": curve[-50:],
    }


# ----------------------------------------------------------------------------- DDP (gloo)


def _ddp_rank(rank: int, world: int, dataset: str, job: dict, port: int, out_file: str, max_train_s: float) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # one core per process
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    xt, yt, xv, yv, manifest = load_prepared(dataset)
    t = job["training"]
    model = DDP(_build(job, manifest))
    opt = _optimizer(model, t)
    loss_fn = torch.nn.CrossEntropyLoss()
    X, Y, XV, YV = (torch.from_numpy(a) for a in (xt, yt, xv, yv))
    b, target = int(t["batch_size"]), float(t["target_value"])
    every = max(1, eval_every_samples(job) // (b * world))  # global samples between evaluations
    rng = np.random.default_rng(job.get("seed", 0))  # same permutation on every rank
    flag = torch.zeros(1)
    dist.barrier()
    t_ready = time.time()
    steps, acc, curve, reached = 0, 0.0, [], False
    per_rank = len(xt) // world
    while not reached:
        perm = torch.from_numpy(rng.permutation(len(xt))[rank::world][:per_rank])
        stop = False
        for i in range(0, per_rank - b + 1, b):
            idx = perm[i : i + b]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(X[idx]), Y[idx]).backward()
            opt.step()
            steps += 1
            if steps % every == 0:
                if rank == 0:
                    acc = _accuracy(model.module, XV, YV)
                    curve.append((round(time.time() - t_ready, 3), steps, round(acc, 5)))
                    flag[0] = 1.0 if acc >= target else (2.0 if time.time() - t_ready > max_train_s else 0.0)
                dist.broadcast(flag, src=0)
                if flag[0] > 0:
                    reached, stop = flag[0] == 1.0, True
                    break
        if stop:
            break
    t_done = time.time()
    if rank == 0:
        Path(out_file).write_text(
            json.dumps(
                {
                    "t_ready": t_ready,
                    "t_done": t_done,
                    "reached": bool(reached),
                    "accuracy": acc,
                    "steps": steps,
                    "samples": steps * b * world,
                    "epochs": steps * b * world / len(xt),
                    "evals": len(curve),
                    "curve": curve[-50:],
                }
            )
        )
    # Both ranks past their last collective, then out without the interpreter's teardown: gloo's
    # threads, torn down at exit while the other rank closes its sockets, now and then abort the
    # process ("terminate called without an active exception") after the result is written.
    dist.barrier()
    os._exit(0)


def _ddp_main(dataset: str, job: dict, t_launch: float, max_train_s: float, world: int = 2) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    from smlt.local.redis_server import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.start_processes(
            _ddp_rank,
            args=(world, dataset, job, free_port(), out, max_train_s),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        r = json.loads(Path(out).read_text())
    return {
        "kind": "ddp",
        "world": world,
        "backend": "gloo",
        "threads_per_process": 1,
        "startup_s": r["t_ready"] - t_launch,
        "train_s": r["t_done"] - r["t_ready"],
        **{k: r[k] for k in ("reached", "accuracy", "steps", "samples", "epochs", "evals", "curve")},
    }


# ----------------------------------------------------------------------------- entry points


def run_baseline(
    kind: str,
    dataset_dir: str | Path,
    job: dict,
    max_train_s: float = 300.0,
    timeout_s: float = 900.0,
    threads: int | None = None,
) -> dict:
    """Run one baseline in a fresh Python process and return its JSON result.
    `threads` (plain only): torch threads; None keeps torch's default (one per core)."""
    extra = ["--threads", str(threads)] if threads else []
    with open(os.devnull, "w") as devnull:
        proc = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                kind,
                "--dataset",
                str(dataset_dir),
                "--job",
                json.dumps(job),
                "--launched",
                repr(time.time()),
                "--max-train-s",
                str(max_train_s),
            ]
            + extra,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            stdin=devnull,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"baseline {kind} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["plain", "ddp"])
    ap.add_argument("--dataset", required=True, help="folder written by smlt data prepare / prepare_dataset")
    ap.add_argument("--job", required=True, help="job JSON (text or a file path)")
    ap.add_argument("--launched", type=float, default=None, help="epoch time the process was launched")
    ap.add_argument("--max-train-s", type=float, default=300.0)
    ap.add_argument("--threads", type=int, default=None, help="plain: torch threads (default: torch's)")
    a = ap.parse_args(argv)
    t_launch = a.launched or time.time()
    job = json.loads(a.job) if a.job.lstrip().startswith("{") else json.loads(Path(a.job).read_text())
    if a.kind == "plain":
        res = _plain_main(a.dataset, job, t_launch, a.max_train_s, a.threads)
    else:
        res = _ddp_main(a.dataset, job, t_launch, a.max_train_s)
    print(json.dumps(res))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()

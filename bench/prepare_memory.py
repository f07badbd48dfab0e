"""The memory and time of `smlt data prepare` by kind of input (#31: a 1.5 GB CSV used to pass 6 GiB
and be killed), the measurements the Prepare function's size limits are derived from
(smlt/runtime/steps/prepare.py).

`--kind csv` (default): a synthetic, learnable CSV of `--size` MB (default 5,000) is written to a
temporary folder: 28 numeric columns (4 decimals, 1 % of one column's cells empty), 3 text columns
of 4, 8 and 16 levels (1 % of one column's cells empty) and a 0/1 label that a logistic model of a
few columns and levels predicts. `smlt data prepare CSV --out FOLDER` then runs in a process of
its own, as a user runs it; its peak resident memory is the high-water mark (VmHWM) of it and
any children, read from /proc every 0.05 s (`ru_maxrss` from `os.wait4` is recorded beside it but
not used: a child started by vfork inherits its parent's high-water mark, here the bench's own
after writing an input); its user + system CPU time gives the cores it used.
Results: the file's top-level record, with a modelled wall time of preparing a 10 GB input as N
objects on a Distributed Map (`distributed_map_model`).

`--kind npz` and `--kind images`, the sources prepare holds in memory: at each of `--sizes` MB
(default 100, 200, 400) a learnable input is written (an uncompressed NPZ of float32 features and
a 0/1 label; or a folder of two classes of 128x128 RGB images, half PNG and half JPEG, a bright
square in a corner per class over noise) and prepared the same way, after a 2 MB one for the
baseline (the interpreter and libraries). Its peak RSS less the baseline, per MB of input (file
bytes; for images also per MB of decoded pixels), is the ratio the limit divides by. Results:
`kinds.<kind>` of the file, the CSV record kept.

The temporary folder is deleted afterwards.

    .venv/bin/python bench/prepare_memory.py               # 5,000 MB CSV (~4 min with the CSV's writing)
    .venv/bin/python bench/prepare_memory.py --size 200    # a quick look, written to results too
    .venv/bin/python bench/prepare_memory.py --kind npz    # 100, 200, 400 MB NPZ (~1 min)
    .venv/bin/python bench/prepare_memory.py --kind images --sizes 50,100,200
    .venv/bin/python bench/prepare_memory.py --smoke       # 2 MB of each kind, nothing written
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402

RESULTS = ROOT / "bench/results/prepare_memory.json"
NUMERIC, LEVELS = 28, (4, 8, 16)
CHUNK_ROWS = 200_000

# The Distributed Map model's inputs that are not measured here, each with its source.
MODEL_FACTS = {
    "max_concurrency": (
        10_000,
        "AWS Step Functions docs: a Distributed Map runs up to 10,000 child executions at once",
    ),
    "account_concurrency": (1_000, "Lambda quotas docs: 1,000 concurrent executions per account and region by default"),
    "scale_step": (
        1_000,
        "Lambda adds up to 1,000 execution environments per function every 10 s (Lambda scaling docs)",
    ),
    "scale_step_s": (10.0, "Lambda scaling docs"),
    "map_run_overhead_s": (
        (2.0, 7.0),
        "a Map Run's start-up: one published figure (a 100-item no-op Distributed Map, 7+ s, AWS re:Post), taken as 2-7 s",
    ),
    "s3_mib_s": (
        75.0,
        "a function's sustained network, ~75 MiB/s at every memory size (Skyrise, arXiv 2501.07771)",
    ),
    "lambda_vcpu_mb": (1_769, "Lambda docs: at 1,769 MB a function has one vCPU"),
    "lambda_timeout_s": (900, "Lambda's 15-minute limit"),
}


def generate_csv(path: Path, size_mb: float, seed: int = 0) -> dict:
    """Write the CSV in chunks until it holds `size_mb` MB; its rows and columns."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    weights = rng.normal(size=NUMERIC) * (rng.random(NUMERIC) < 0.3)
    effects = [rng.normal(size=k) for k in LEVELS]
    target, rows, header = size_mb * 1e6, 0, True
    with path.open("wb") as f:
        while f.tell() < target:
            n = CHUNK_ROWS
            x = np.round(rng.normal(size=(n, NUMERIC)), 4)
            codes = [rng.integers(0, k, n) for k in LEVELS]
            logit = x @ weights + sum(e[c] for e, c in zip(effects, codes))
            label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
            cols = {f"x{i}": pa.array(x[:, i], mask=(rng.random(n) < 0.01) if i == 2 else None) for i in range(NUMERIC)}
            for j, (k, c) in enumerate(zip(LEVELS, codes)):
                names = np.array([f"level{v}" for v in range(k)])
                cols[f"c{j}"] = pa.array(names[c], mask=(rng.random(n) < 0.01) if j == 1 else None)
            cols["label"] = pa.array(label)
            table = pa.table(cols)
            left = target - f.tell()
            if left < n * 200:  # the last chunk: about the bytes still wanted (rows of ~230 bytes)
                table = table.slice(0, max(1, int(left / 230)))
            options = pcsv.WriteOptions(include_header=header, quoting_style="needed")
            pcsv.write_csv(table, f, options)
            rows += table.num_rows
            header = False
        size = f.tell()
    return {"mb": round(size / 1e6, 1), "rows": rows, "columns": NUMERIC + len(LEVELS) + 1, "text_columns": len(LEVELS)}


NPZ_FEATURES = 64
IMAGE_SIDE = 128  # pixels: 49,152 bytes of RGB each once decoded


def generate_npz(path: Path, size_mb: float, seed: int = 0) -> dict:
    """An uncompressed NPZ of about `size_mb` MB: float32 x (rows, 64) and a 0/1 y that a linear
    model of a third of the features predicts. Uncompressed: its file's bytes are its arrays'."""
    rng = np.random.default_rng(seed)
    rows = max(20, int(size_mb * 1e6 / (NPZ_FEATURES * 4 + 8)))
    x = rng.normal(size=(rows, NPZ_FEATURES)).astype(np.float32)
    w = rng.normal(size=NPZ_FEATURES) * (rng.random(NPZ_FEATURES) < 0.3)
    y = (x @ w + rng.normal(size=rows) > 0).astype(np.int64)
    np.savez(path, x=x, y=y)
    size = path.stat().st_size
    return {"mb": round(size / 1e6, 1), "decoded_mb": round((x.nbytes + y.nbytes) / 1e6, 1), "rows": rows}


def generate_images(folder: Path, size_mb: float, seed: int = 0) -> dict:
    """A folder of two class subfolders of 128x128 RGB images, alternately PNG and JPEG (quality
    90), until their files hold `size_mb` MB: a bright square in the top-left (class a) or
    bottom-right (class b) corner over a noisy, smooth background. A handful of backgrounds are
    drawn and reused (shifted), so writing is quick; each image's noise and square differ."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    side = IMAGE_SIDE
    grid = np.linspace(0, 1, side, dtype=np.float32)
    backgrounds = [
        (np.outer(grid, grid)[..., None] * rng.uniform(40, 120, 3) + rng.normal(0, 12, (side, side, 3)))
        for _ in range(8)
    ]
    for name in ("a", "b"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    total, n = 0, 0
    while total < size_mb * 1e6:
        label = n % 2
        pixels = np.roll(backgrounds[n % 8], int(rng.integers(side)), axis=1).copy()
        pixels += rng.normal(0, 6, (side, side, 3))
        at = int(rng.integers(4, side // 4))
        corner = slice(at, at + side // 4) if label == 0 else slice(side - at - side // 4, side - at)
        pixels[corner, corner] += 110
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        path = folder / "ab"[label] / (f"{n:06d}.png" if n % 4 < 2 else f"{n:06d}.jpg")
        image.save(path, quality=90) if path.suffix == ".jpg" else image.save(path)
        total += path.stat().st_size
        n += 1
    return {
        "mb": round(total / 1e6, 1),
        "decoded_mb": round(n * side * side * 3 / 1e6, 1),
        "images": n,
        "pixels": f"{side}x{side} RGB",
    }


GENERATE = {"npz": (generate_npz, "data.npz"), "images": (generate_images, "images")}


def _tree_rss_kb(pid: int, field: str = "VmHWM") -> int:
    """KB of a process and its descendants, from /proc (0 once it is gone): their resident
    high-water marks (VmHWM; VmRSS for what is resident now)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(status.split(f"{field}:")[1].split()[0])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def measure(source: Path, out: Path, shards: int = 16) -> dict:
    """Run `smlt data prepare` on `source` as a user would, sampling its memory."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "smlt.cli", "data", "prepare", str(source), "--out", str(out), "--shards", str(shards)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"kb": 0}
    lines: list[tuple[float, str]] = []

    def sample() -> None:
        while proc.poll() is None:
            peak["kb"] = max(peak["kb"], _tree_rss_kb(proc.pid))
            time.sleep(0.05)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip()))

    threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=read, daemon=True)]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join(timeout=5)
    if proc.returncode != 0:
        raise SystemExit(f"smlt data prepare failed ({proc.returncode}):\n" + "\n".join(text for _, text in lines))
    pass1 = next((t for t, text in lines if "statistics (pass 1 of 2): done" in text), None)
    cpu = usage.ru_utime + usage.ru_stime
    shard_bytes = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    return {
        "peak_rss_mb": round(peak["kb"] / 1024, 1),
        "peak_rss_sampled_mb": round(peak["kb"] / 1024, 1),
        "ru_maxrss_mb": round(usage.ru_maxrss / 1024, 1),
        "wall_s": round(wall, 1),
        "pass1_s": round(pass1, 1) if pass1 is not None else None,
        "cpu_s": round(cpu, 1),
        "cores_used": round(cpu / wall, 2),
        "shards": len(list(out.glob("*.safetensors"))),
        "shards_mb": round(shard_bytes / 1e6, 1),
        "said": [text.replace(f"{source.parent}/", "TMP/") for _, text in lines][-3:],  # its last lines
    }


def model(input_mb: float, run: dict, start_s: float, size_mb: float = 10_000, objects=(1, 10, 50, 100, 1_000)) -> dict:
    """A MODEL (nothing run on AWS) of preparing `size_mb` MB split into N objects on Distributed
    Maps: pass 1 (statistics) in one Map Run, a merge of the N partial statistics, pass 2 (shards)
    in a second Map Run, each child a 1-vCPU function preparing one object at the rate measured
    here per core (plus `start_s`, the measured wall time of preparing a 2 MB CSV: a process's
    start and imports), reading its object from S3 in each pass and writing its shards in the
    second, at a function's sustained network rate. It assumes a Lambda vCPU as fast as this
    machine's core, every child started at once (no start rate is published: Lambda's first
    1,000 environments come at once) and the statistics mergeable (they are: moments, value
    counts, median histograms)."""
    fact = {k: v for k, (v, _) in MODEL_FACTS.items()}
    per_mb_s = run["cpu_s"] / input_mb  # CPU seconds per MB of CSV, both passes
    share1 = run["pass1_s"] / run["wall_s"] if run.get("pass1_s") else 0.5
    out_ratio = run["shards_mb"] / input_mb
    s3_mb_s = fact["s3_mib_s"] * 1.048576
    rows = []
    for n in objects:
        mb = size_mb / n
        child1 = start_s + mb * per_mb_s * share1 + mb / s3_mb_s
        child2 = start_s + mb * per_mb_s * (1 - share1) + mb * (1 + out_ratio) / s3_mb_s
        waves = math.ceil(n / min(fact["max_concurrency"], fact["account_concurrency"]))
        ramp = (min(n, fact["account_concurrency"]) - 1) // fact["scale_step"] * fact["scale_step_s"]
        lo, hi = fact["map_run_overhead_s"]
        runs = [waves * child + ramp for child in (child1, child2)]
        rows.append(
            {
                "objects": n,
                "object_mb": round(mb, 1),
                "child_s": [round(child1, 1), round(child2, 1)],
                "fits_15_min": max(child1, child2) <= fact["lambda_timeout_s"],
                "wall_s": [round(sum(runs) + 2 * lo + 1, 1), round(sum(runs) + 2 * hi + 1, 1)],
            }
        )
    return {
        "note": "a model from the measured CPU seconds per MB and the facts below, not a measurement on AWS",
        "input_mb": size_mb,
        "cpu_s_per_mb": round(per_mb_s, 4),
        "child_start_s": round(start_s, 2),
        "pass1_share": round(share1, 3),
        "facts": {k: {"value": v, "source": src} for k, (v, src) in MODEL_FACTS.items()},
        "rows": rows,
    }


def run_csv(size_mb: float, tmp: str | None, keep: bool = False) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="smlt-prepare-bench-", dir=tmp))
    try:
        generate_csv(folder / "small.csv", 2)
        start_s = measure(folder / "small.csv", folder / "small")["wall_s"]
        t = time.perf_counter()
        data = generate_csv(folder / "big.csv", size_mb)
        data["written_s"] = round(time.perf_counter() - t, 1)
        result = measure(folder / "big.csv", folder / "prepared")
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    result["mb_per_s"] = round(data["mb"] / result["wall_s"], 2)
    result["mb_per_s_per_core"] = round(data["mb"] / result["cpu_s"], 2)
    return {
        "input": data,
        "prepare": result,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "shared": True},
        "distributed_map_model": model(data["mb"], result, start_s),
    }


# What the Prepare function imports before it prepares anything (lambdas/prepare/handler.py and
# the readers it loads on the way: pyarrow for tables, Pillow for images, an S3 client).
FUNCTION_IMPORTS = """
import boto3, lambdas.prepare.handler, smlt.runtime.pipeline, smlt.runtime.data.prepare
import smlt.runtime.data.table_reader, pyarrow.csv, pyarrow.parquet, PIL.Image
boto3.client("s3", region_name="us-east-1")
print(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
"""


def function_imports() -> dict:
    """The resident high-water mark of a process that imports what the Prepare function does."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", FUNCTION_IMPORTS], env=env, capture_output=True, text=True, check=True)
    return {"imports_rss_mb": round(int(out.stdout.split()[-1]) / 1024, 1), "modules": FUNCTION_IMPORTS.strip()}


def run_in_memory(kind: str, sizes: list[float], tmp: str | None, base_mb: float = 2) -> dict:
    """The kind's baseline (a `base_mb` MB input: the interpreter and libraries) and, at each size,
    its peak RSS less the baseline per MB of input (its files) and of decoded arrays."""
    make, name = GENERATE[kind]
    runs = []
    for size in [base_mb, *sizes]:
        folder = Path(tempfile.mkdtemp(prefix="smlt-prepare-bench-", dir=tmp))
        try:
            t = time.perf_counter()
            data = make(folder / name, size)
            data["written_s"] = round(time.perf_counter() - t, 1)
            result = measure(folder / name, folder / "prepared")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        keep = ("peak_rss_mb", "ru_maxrss_mb", "wall_s", "cpu_s", "shards", "shards_mb")
        runs.append({"input": data, **{k: result[k] for k in keep}})
    base = runs[0]["peak_rss_mb"]
    for r in runs[1:]:
        grew = r["peak_rss_mb"] - base
        r["rss_over_baseline_mb"] = round(grew, 1)
        r["per_input_mb"] = round(grew / r["input"]["mb"], 2)
        r["per_decoded_mb"] = round(grew / r["input"]["decoded_mb"], 2)
        r["input_mb_per_s"] = round(r["input"]["mb"] / r["wall_s"], 1)
    measured = runs[1:]
    return {
        "baseline_rss_mb": base,
        "baseline_input_mb": runs[0]["input"]["mb"],
        "runs": measured,
        # the largest ratio measured: what a limit divides the memory left by
        "rss_per_input_mb": max(r["per_input_mb"] for r in measured),
        "rss_per_decoded_mb": max(r["per_decoded_mb"] for r in measured),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "shared": True},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("csv", "npz", "images"), default="csv", help="what to prepare (default csv)")
    ap.add_argument("--size", type=float, default=5_000, help="MB of CSV (default 5,000)")
    ap.add_argument("--sizes", default="100,200,400", help="MB of NPZ or images, comma-separated (default 100,200,400)")
    ap.add_argument("--tmp", help="folder for the inputs and the prepared datasets (default: the system's temp)")
    ap.add_argument("--keep", action="store_true", help="keep the CSV and the prepared dataset (--kind csv)")
    smoke.add_flag(ap)
    a = ap.parse_args()
    if a.smoke:
        kinds = {k: run_in_memory(k, [2], a.tmp, base_mb=0.5) for k in GENERATE}
        smoke.report({"csv": run_csv(2, a.tmp), **kinds, "function": function_imports()})
        return
    recorded = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if a.kind == "csv":
        results = {**run_csv(a.size, a.tmp, a.keep), **{k: recorded[k] for k in ("kinds", "function") if k in recorded}}
    else:
        sizes = [float(s) for s in a.sizes.split(",")]
        kinds = {**recorded.get("kinds", {}), a.kind: run_in_memory(a.kind, sizes, a.tmp)}
        results = {**recorded, "kinds": kinds, "function": function_imports()}
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

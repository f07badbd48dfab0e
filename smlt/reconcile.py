"""An independent check of a finished run, from what is stored only: nothing lost, nothing counted
twice, every model what its round's accepted updates make of the one before.

It reads the run's S3 objects and DynamoDB items with the boto3 clients it is given, decodes
safetensors with `safetensors.numpy` and does its own arithmetic in float64, so a bug in the
aggregator (or in the code that decides what counts) cannot hide here: it shares no code with
`smlt.runtime.aggregate` or `smlt.runtime.steps`, only the key layout (`smlt.runtime.keys`) and the item models.

For every aggregated round r (a ROUND item):
1. every update object is in the applied ledger (`RoundItem.accepted`), or has a reason: the round
   diverged (nothing applied), the worker recorded a named error (`ERROR#r#w`), the object was
   uploaded after the round's seal (late: its record could never land), or the worker's own ATTEMPT
   item says the seal refused its record (a straggler: it ended `StaleInvocation` after the seal, or
   the Map stopped waiting for it, `States.Timeout`). Anything else is a finding.
2. every ledger entry names its worker once and has its update object and its worker record, both
   with the ledger's samples; every record that trained is in the ledger (unless the round diverged);
   a sharded round's `accepted.json` (what its k aggregators averaged) is the ledger.
3. every update the round refused (`RoundItem.rejected`) deserves it, recomputed here: its object
   is missing, unreadable or does not match its record's sha256, or its norm is more than the guard's
   factor times the median of the round's update norms (the guard's two numbers are shared with
   `smlt.runtime.aggregate.guard`, nothing else).
4. digests: every applied update matches its record's `update_sha256`, model r+1 the ROUND item's
   `model_sha256` (a sliced model: sha256 of its parts' sha256 digests, manifest first), model 0
   META's `model0_sha256`, final/model.safetensors META's `final.model_sha256` (a finding of the
   last round). A finding names the object and both digests.
5. model r+1 equals model r + server_lr * (sample-weighted mean of the accepted deltas); integer
   tensors get the mean rounded half to even, without server_lr; a diverged or evaluation-only round
   leaves model r+1 equal to model r. Floating values match within the rounding bound of float32
   sums in any order: |stored - exact| <= 2 eps32 ((n + 2) server_lr sum_i |c_i d_i| + |model r|)
   per element, c_i = samples_i / total, n updates (the exact value computed in float64).

4. every worker record has an ATTEMPT item of its worker that ended ok (smlt.runtime.ledger: the bill
   has the invocation that did the work), in runs that record them.

An object that cannot be decoded is a finding too. Findings are returned
(`Reconciliation.findings`), never raised. A local run is checked from its saved state in its
--out folder (`reconcile_saved`, `smlt verify RUN --local --out OUT`), which keeps every item and
object of its aggregated rounds this needs (smlt.snapshot).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
from pydantic import BaseModel, Field
from safetensors import SafetensorError

from smlt.runtime import keys
from smlt.runtime.aggregate.guard import MIN_UPDATES, NORM_FACTOR
from smlt.runtime.errors import StaleInvocation
from smlt.runtime.items import Accepted, ErrorItem, MetaItem, PlanItem, RoundItem, SealItem, WorkerItem
from smlt.runtime.ledger import PREFIX as ledger_prefix
from smlt.runtime.ledger import TIMEOUTS, rounds_in_model, rounds_said
from smlt.runtime.records import RunTable

EPS32 = float(np.finfo(np.float32).eps)
TINY32 = float(np.finfo(np.float32).tiny)
_UPDATE = re.compile(r"rounds/(\d{6})/updates/(\d{5})\.safetensors$")


class Finding(BaseModel):
    round: int
    # unexplained_update, missing_update, missing_record, applied_twice, samples, not_applied, committed, model,
    # unreadable (a damaged model or applied update), not_aggregated (updates of a round with no ROUND item),
    # digest (a stored object that is not the one its item recorded), rejected (refused without cause),
    # final (final/model.safetensors is no stored model), rounds (META's final.rounds is not the count of
    # the rounds that trained the final model)
    kind: str
    worker: int | None = None
    detail: str


class RoundCheck(BaseModel):
    round: int
    aggregated: bool = False  # a ROUND item
    trained: bool = False  # aggregated, neither evaluation-only nor diverged
    applied: list[int] = Field(default_factory=list)  # workers in the ledger
    excused: dict[int, str] = Field(default_factory=dict)  # update objects not applied, with the reason
    findings: list[Finding] = Field(default_factory=list)


class Reconciliation(BaseModel):
    run_id: str
    rounds: list[RoundCheck] = Field(default_factory=list)
    pending: list[int] = Field(default_factory=list)  # rounds with updates after the last aggregated one
    # The stored model final/model.safetensors is (found by its tensors), and the rounds that
    # trained it (smlt.runtime.ledger.rounds_in_model over the rounds reconciled here); None: no final model.
    final_model: int | None = None
    final_rounds: int | None = None

    @property
    def said(self) -> str:
        """The rounds as `smlt run` names them (smlt.runtime.ledger.rounds_said)."""
        aggregated = sum(1 for r in self.rounds if r.aggregated)
        return rounds_said(aggregated, aggregated if self.final_rounds is None else self.final_rounds)

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.rounds for f in r.findings]

    @property
    def ok(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class _Update:
    key: str
    samples: int | None  # from the update's own header (None: unreadable)
    uploaded: float  # S3 LastModified, epoch seconds


# --------------------------------------------------------------------------- reading


def _header(blob: bytes) -> dict[str, Any]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + n])


def tensors(blob: bytes) -> dict[str, np.ndarray]:
    """A safetensors blob as numpy arrays, BF16 widened to float32 (numpy has no bfloat16)."""
    head = _header(blob)
    if not any(t.get("dtype") == "BF16" for n, t in head.items() if n != "__metadata__"):
        return safetensors.numpy.load(blob)
    start = 8 + int.from_bytes(blob[:8], "little")
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = blob[start + b : start + e]
        if t["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(t["shape"])
        else:
            out[name] = safetensors.numpy.load(_single(name, t, raw))[name]
    return out


def _single(name: str, t: dict, raw: bytes) -> bytes:
    """A one-tensor safetensors blob (to decode a non-BF16 tensor of a mixed blob with the library)."""
    head = json.dumps({name: {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [0, len(raw)]}}).encode()
    return len(head).to_bytes(8, "little") + head + raw


class S3Objects:
    """A bucket's objects through a boto3 S3 client: the deployed stack's, or the local engine's."""

    def __init__(self, s3, bucket: str):
        self.s3, self.bucket = s3, bucket

    def list(self, prefix: str) -> dict[str, float]:
        """{key: LastModified, epoch seconds} under prefix."""
        out: dict[str, float] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.update({o["Key"]: o["LastModified"].timestamp() for o in page.get("Contents", [])})
        return out

    def get(self, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def head(self, key: str, n: int) -> bytes:
        return self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{n - 1}")["Body"].read()


class SavedObjects:
    """A local run's saved bucket (OUT/.state/runs/RUN/s3/<bucket>/<key>, smlt.snapshot): each
    file's mtime is its object's LastModified, kept when it was copied."""

    def __init__(self, root: Path):
        self.root = root

    def list(self, prefix: str) -> dict[str, float]:
        base = self.root / prefix
        if not base.is_dir():
            return {}
        return {p.relative_to(self.root).as_posix(): p.stat().st_mtime for p in base.rglob("*") if p.is_file()}

    def get(self, key: str) -> bytes | None:
        path = self.root / key
        return path.read_bytes() if path.is_file() else None

    def head(self, key: str, n: int) -> bytes:
        with (self.root / key).open("rb") as f:
            return f.read(n)


class _Run:
    """The stored state of one run, read once."""

    def __init__(self, objects: S3Objects | SavedObjects, table: RunTable, run_id: str):
        self.store, self.run_id, self.table = objects, run_id, table
        self.objects = self.store.list(keys.run_prefix(run_id) + "rounds/")
        self._models: dict[int, dict[str, np.ndarray] | None] = {}

    def get(self, key: str) -> bytes | None:
        if key not in self.objects:
            return None
        return self.store.get(key)

    def updates(self) -> dict[int, dict[int, _Update]]:
        """{round: {worker: update}} of every update object stored."""
        out: dict[int, dict[int, _Update]] = {}
        for key, uploaded in sorted(self.objects.items()):
            m = _UPDATE.search(key)
            if m:
                out.setdefault(int(m[1]), {})[int(m[2])] = _Update(key, self._samples(key), uploaded)
        return out

    def _samples(self, key: str) -> int | None:
        head = self.store.head(key, 65536)
        try:
            return int(_header(head)["__metadata__"]["samples"])
        except (ValueError, KeyError, TypeError):
            return None

    def model(self, rnd: int) -> dict[str, np.ndarray] | None:
        """Model rnd as stored: its one object, else assembled from its slices; None if absent."""
        if rnd not in self._models:
            self._models.pop(rnd - 2, None)  # a round needs models r and r+1 only
            blob = self.get(keys.model_key(self.run_id, rnd))
            self._models[rnd] = tensors(blob) if blob is not None else self._sliced(rnd)
        return self._models[rnd]

    def _sliced(self, rnd: int) -> dict[str, np.ndarray] | None:
        """The slices' format: a manifest naming the floating tensors in flat order and each slice's
        [start, end) of the flat float32 vector; the other tensors in one `rest` object."""
        raw = self.get(keys.slices_manifest_key(self.run_id, rnd))
        if raw is None:
            return None
        manifest = json.loads(raw)
        parts = []
        for s in manifest["slices"]:
            blob = self.get(s["key"])
            if blob is None:
                return None
            parts.append(tensors(blob)["flat"])
        flat, state, offset = np.concatenate(parts) if parts else np.empty(0, np.float32), {}, 0
        for t in manifest["tensors"]:
            n = int(np.prod(t["shape"]))
            state[t["name"]] = flat[offset : offset + n].reshape(t["shape"])  # as stored: float32
            offset += n
        rest = self.get(manifest["rest"]) if manifest.get("rest") else None
        return {**state, **(tensors(rest) if rest is not None else {})}

    def model_digest(self, rnd: int) -> tuple[str, str] | None:
        """(key, sha256) of model rnd as stored: of its one object, else of its slices' parts
        (sha256 of the sha256 digests of the manifest, each slice and the rest, in that order)."""
        key = keys.model_key(self.run_id, rnd)
        blob = self.get(key)
        if blob is not None:
            return key, _sha256(blob)
        mkey = keys.slices_manifest_key(self.run_id, rnd)
        raw = self.get(mkey)
        if raw is None:
            return None
        manifest = json.loads(raw)
        names = [s["key"] for s in manifest["slices"]] + ([manifest["rest"]] if manifest.get("rest") else [])
        h = hashlib.sha256(hashlib.sha256(raw).digest())
        for name in names:
            part = self.get(name)
            h.update(hashlib.sha256(part if part is not None else b"").digest())
        return mkey, h.hexdigest()

    def server_lr(self, rnd: int) -> float:
        plan = self.table.get(keys.plan_sk(rnd), PlanItem)
        if plan is not None and plan.spec is not None:
            return plan.spec.job.training.server_lr
        meta = self.table.get(keys.META, MetaItem)
        return meta.job.training.server_lr if meta is not None else 1.0


# --------------------------------------------------------------------------- the checks


def reconcile(s3, dynamodb, bucket: str, table: str, run_id: str) -> Reconciliation:
    """Check a run's stored updates, ledgers and models (see the module docstring)."""
    return _reconcile(_Run(S3Objects(s3, bucket), RunTable(table, run_id, client=dynamodb), run_id))


def _reconcile(run: _Run) -> Reconciliation:
    run_id = run.run_id
    updates = run.updates()
    rounds = {r.round: r for r in run.table.rounds()}
    last = max(rounds, default=-1)
    result = Reconciliation(run_id=run_id, pending=sorted(r for r in updates if r > last))
    metered = bool(run.table.query(ledger_prefix))  # the run's invocations record ATTEMPT items
    for rnd in sorted(set(rounds) | {r for r in updates if r <= last}):
        check = RoundCheck(round=rnd)
        item = rounds.get(rnd)
        if item is None:
            check.findings.append(Finding(round=rnd, kind="not_aggregated", detail="update objects, no ROUND item"))
        else:
            check.aggregated = True
            check.trained = not (item.eval_only or item.diverged)
            _check_ledger(run, item, updates.get(rnd, {}), check)
            _check_digests(run, item, updates.get(rnd, {}), check)
            _check_model(run, item, updates.get(rnd, {}), check)
            _check_billed(run, rnd, check, metered)
        result.rounds.append(check)
    if result.rounds:
        result.rounds[-1].findings.extend(_final_findings(run, result.rounds[-1].round))
        result.rounds[-1].findings.extend(_final_rounds(run, result, rounds))
    return result


def _final_rounds(run: _Run, result: Reconciliation, rounds: dict[int, RoundItem]) -> list[Finding]:
    """Which stored model final/model.safetensors is (the newest model r whose tensors it holds),
    the rounds that trained it (rounds before r that applied updates), and META's `final.rounds`
    against that count."""
    key = keys.final_model_key(run.run_id)
    if any(f.kind == "digest" and key in f.detail for rr in result.rounds for f in rr.findings):
        return []  # a final model changed since it was recorded is that one finding
    blob = run.store.get(key)
    if blob is None:
        return []
    try:
        final = tensors(blob)
    except (SafetensorError, ValueError, KeyError, TypeError):
        return []  # a damaged final model is a digest finding
    for r in sorted((*rounds, max(rounds, default=-1) + 1), reverse=True):
        try:
            stored = run.model(r)
        except (SafetensorError, ValueError, KeyError, TypeError):
            continue
        if stored is not None and _same(stored, final):
            result.final_model = r
            break
    else:
        last = result.rounds[-1].round
        return [Finding(round=last, kind="final", detail="final/model.safetensors is none of the run's stored models")]
    result.final_rounds = rounds_in_model(rounds.values(), result.final_model)
    meta = run.table.get(keys.META, MetaItem)
    said = meta.final.rounds if meta is not None and meta.final is not None else None
    if said is None or said == result.final_rounds:
        return []
    detail = (
        f"META's final says {said} rounds, but the final model is model {result.final_model}, "
        f"which {result.final_rounds} rounds trained"
    )
    return [Finding(round=result.rounds[-1].round, kind="rounds", detail=detail)]


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a)


def _final_findings(run: _Run, last: int) -> list[Finding]:
    """final/model.safetensors against the digest finalize recorded in META's `final`."""
    meta = run.table.get(keys.META, MetaItem)
    expected = meta.final.model_sha256 if meta is not None and meta.final is not None else None
    if expected is None:
        return []
    key = keys.final_model_key(run.run_id)
    blob = run.store.get(key)
    if blob is None:
        return [Finding(round=last, kind="digest", detail=f"{key} is missing; META's final recorded {expected}")]
    if _sha256(blob) == expected:
        return []
    return [
        Finding(round=last, kind="digest", detail=f"{key} has sha256 {_sha256(blob)}, META's final recorded {expected}")
    ]


def _check_ledger(run: _Run, item: RoundItem, updates: dict[int, _Update], check: RoundCheck) -> None:
    rnd = item.round
    ledger = item.accepted
    check.applied = [a.worker for a in ledger]
    records = {w.worker: w for w in run.table.workers(rnd)}
    for w in sorted(w for w, n in Counter(check.applied).items() if n > 1):
        check.findings.append(Finding(round=rnd, kind="applied_twice", worker=w, detail="the ledger names it twice"))
    for a in ledger:
        _check_entry(rnd, a, updates.get(a.worker), records.get(a.worker), check)
    applied = set(check.applied)
    refused = _check_rejected(run, item, updates, records, check)
    if not item.diverged:
        for w, rec in sorted(records.items()):
            if rec.samples > 0 and w not in applied and w not in refused and not item.eval_only:
                detail = f"recorded {rec.samples} samples before the seal, not in the ledger"
                check.findings.append(Finding(round=rnd, kind="not_applied", worker=w, detail=detail))
    _check_committed(run, item, check)
    unapplied = {w: u for w, u in updates.items() if w not in applied and w not in refused}
    _excuse(run, item, unapplied, records, check)


def _check_billed(run: _Run, rnd: int, check: RoundCheck, metered: bool) -> None:
    """Every worker record of the round has an ATTEMPT item of its worker that ended ok (the
    bill has the invocation that did the work; smlt.runtime.ledger). A run with no ATTEMPT item at
    all was run before invocations recorded them: nothing to check; in a run that has them, a round
    without any (not even its aggregator's) is a finding: its bill is missing, not zero."""
    attempts = run.table.query(f"ATTEMPT#{rnd:06d}#")
    if not attempts:
        if metered:
            detail = "no ATTEMPT item (not even its aggregation's), while the run's other rounds have them"
            check.findings.append(Finding(round=rnd, kind="unbilled", detail=detail))
        return
    billed = {a.get("worker") for a in attempts if a.get("outcome") == "ok" and not a.get("estimated")}
    for r in run.table.workers(rnd):
        if r.worker not in billed:
            detail = "a worker record without an ATTEMPT item of its worker: the bill misses it"
            check.findings.append(Finding(round=rnd, kind="unbilled", worker=r.worker, detail=detail))


def _sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _norm(blob: bytes) -> float:
    """An update's L2 norm over its floating tensors, in float64."""
    total = 0.0
    for v in tensors(blob).values():
        if np.issubdtype(v.dtype, np.floating):
            total += float(np.sum(np.square(v.astype(np.float64))))
    return math.sqrt(total)


def _intact(blob: bytes, record: WorkerItem | None) -> bool:
    return record is None or record.update_sha256 in (None, _sha256(blob))


def _check_rejected(
    run: _Run, item: RoundItem, updates: dict[int, _Update], records: dict[int, WorkerItem], check: RoundCheck
) -> set[int]:
    """The workers the round refused, each excused with its reason when the refusal holds here:
    its update is missing, damaged or unreadable, or far outside the round's norms; else a finding."""
    if not item.rejected:
        return set()
    blobs = {w: run.get(u.key) for w, u in updates.items() if w in records and records[w].samples > 0}
    norms: dict[int, float] = {}
    for w, blob in blobs.items():
        try:
            if blob is not None and _intact(blob, records.get(w)):
                norms[w] = _norm(blob)
        except (SafetensorError, ValueError, KeyError, TypeError):
            pass  # unreadable: a refusal holds
    finite = [n for n in norms.values() if math.isfinite(n)]
    median = statistics.median(finite) if len(finite) >= MIN_UPDATES else math.inf
    for r in item.rejected:
        if r.worker not in norms or norms[r.worker] > NORM_FACTOR * median:
            check.excused[r.worker] = f"rejected: {r.reason}"
        else:
            detail = (
                f"refused ({r.reason}), but its update is intact and its norm {norms[r.worker]:.4g} is within the guard"
            )
            check.findings.append(Finding(round=item.round, kind="rejected", worker=r.worker, detail=detail))
    return {r.worker for r in item.rejected}


def _check_digests(run: _Run, item: RoundItem, updates: dict[int, _Update], check: RoundCheck) -> None:
    """Applied updates and the models the round read and wrote, against the digests their items
    recorded when they were written."""
    records = {w.worker: w for w in run.table.workers(item.round)} if item.accepted else {}
    for a in item.accepted:
        u, rec = updates.get(a.worker), records.get(a.worker)
        blob = run.get(u.key) if u is not None else None
        if u is None or blob is None or rec is None or rec.update_sha256 in (None, _sha256(blob)):
            continue  # a missing update or record is a finding of the ledger check
        detail = f"{u.key} (applied) has sha256 {_sha256(blob)}, its record says {rec.update_sha256}"
        check.findings.append(Finding(round=item.round, kind="digest", worker=a.worker, detail=detail))
    wanted = [(item.round + 1, item.model_sha256)]
    if item.round == 0:
        meta = run.table.get(keys.META, MetaItem)
        wanted.append((0, meta.model0_sha256 if meta else None))
    for rnd, expected in wanted:
        stored = run.model_digest(rnd)
        if expected is not None and stored is not None and stored[1] != expected:
            detail = f"{stored[0]} has sha256 {stored[1]}, its item recorded {expected}"
            check.findings.append(Finding(round=item.round, kind="digest", detail=detail))


def _check_committed(run: _Run, item: RoundItem, check: RoundCheck) -> None:
    """A sharded round: the list its k aggregators averaged (accepted.json) is the ledger (but the
    updates it refused: model r+1 was then made again without them)."""
    raw = run.get(keys.accepted_key(run.run_id, item.round))
    if raw is None or item.diverged:  # a diverged round keeps the list but applies nothing
        return
    refused = {r.worker for r in item.rejected}  # averaged by the slices, then made again without
    committed = sorted(
        (int(a["worker"]), int(a["samples"])) for a in json.loads(raw) if int(a["worker"]) not in refused
    )
    ledger = sorted((a.worker, a.samples) for a in item.accepted)
    if committed != ledger:
        detail = f"the aggregators averaged {committed}, the ledger says {ledger}"
        check.findings.append(Finding(round=item.round, kind="committed", detail=detail))


def _check_entry(rnd: int, a: Accepted, update: _Update | None, record: WorkerItem | None, check: RoundCheck) -> None:
    w = a.worker
    if update is None:
        check.findings.append(Finding(round=rnd, kind="missing_update", worker=w, detail="applied, no update object"))
    elif update.samples != a.samples:
        detail = f"ledger {a.samples} samples, the update's header {update.samples}"
        check.findings.append(Finding(round=rnd, kind="samples", worker=w, detail=detail))
    if record is None:
        check.findings.append(Finding(round=rnd, kind="missing_record", worker=w, detail="applied, no worker record"))
    elif record.samples != a.samples:
        detail = f"ledger {a.samples} samples, the worker's record {record.samples}"
        check.findings.append(Finding(round=rnd, kind="samples", worker=w, detail=detail))


def _excuse(
    run: _Run, item: RoundItem, unapplied: dict[int, _Update], records: dict[int, WorkerItem], check: RoundCheck
) -> None:
    """The reason each update object outside the ledger was not applied, or a finding."""
    rnd = item.round
    errors: dict[int, ErrorItem] = run.table.errors(rnd) if unapplied else {}
    seal = run.table.get(keys.seal_sk(rnd), SealItem) if unapplied else None
    stragglers = _stragglers(run, rnd, seal) if unapplied and seal is not None else {}
    for w, u in sorted(unapplied.items()):
        if item.diverged:
            check.excused[w] = f"round diverged: {item.reason}"
        elif w in errors:
            check.excused[w] = f"worker error {errors[w].error}: {errors[w].message}"
        elif w not in records and seal is not None and int(u.uploaded) >= seal.sealed_at:
            check.excused[w] = "late: uploaded after the round was sealed"
        elif w not in records and w in stragglers:
            check.excused[w] = stragglers[w]
        elif w not in records:
            detail = f"{u.key}: no ledger entry, no worker record and no recorded reason (a report lost?)"
            check.findings.append(Finding(round=rnd, kind="unexplained_update", worker=w, detail=detail))
        # a record outside the ledger is reported by _check_ledger already


def _stragglers(run: _Run, rnd: int, seal: SealItem) -> dict[int, str]:
    """The workers of round `rnd` whose own ATTEMPT item says the seal refused their record: an
    attempt that ended `StaleInvocation` after the round was sealed (it uploaded its update, then
    found the round closed; S3 times an upload to the second, so an update stored in the seal's
    second, or before it, is excused by this and not by its time), or an attempt the Map stopped
    waiting for (`States.Timeout`, estimated by the aggregator from Step Functions' outcome: its
    record had not landed when the round was sealed)."""
    out: dict[int, str] = {}
    for a in run.table.query(f"ATTEMPT#{rnd:06d}#"):
        worker, outcome = a.get("worker"), str(a.get("outcome", ""))
        if worker is None:
            continue
        ended = float(a.get("started_at", 0)) + float(a.get("duration_s", 0))
        if outcome == StaleInvocation.__name__ and not a.get("estimated") and ended >= seal.sealed_at:
            out[int(worker)] = (
                f"late: its record was refused by the seal (its attempt ended {outcome} {ended - seal.sealed_at:.2f} s "
                "after the round was sealed)"
            )
        elif outcome in TIMEOUTS and a.get("estimated"):
            out.setdefault(int(worker), f"late: the round stopped waiting for it ({outcome}) before its record landed")
    return out


def _check_model(run: _Run, item: RoundItem, updates: dict[int, _Update], check: RoundCheck) -> None:
    try:
        check.findings.extend(_model_findings(run, item, updates))
    except (SafetensorError, ValueError, KeyError, TypeError) as e:  # a damaged object is a finding too
        detail = f"model {item.round}, model {item.round + 1} or an applied update cannot be read: {e!r}"
        check.findings.append(Finding(round=item.round, kind="unreadable", detail=detail))


def _model_findings(run: _Run, item: RoundItem, updates: dict[int, _Update]) -> list[Finding]:
    rnd = item.round
    old, new = run.model(rnd), run.model(rnd + 1)
    if old is None or new is None:
        return [Finding(round=rnd, kind="model", detail=f"model {rnd if old is None else rnd + 1} is not stored")]
    if not item.accepted:  # evaluation-only, diverged, or nothing trained: model r carried over
        expected = {k: (v.astype(np.float64), np.zeros(v.shape)) for k, v in old.items()}
    else:
        blobs = [(float(a.samples), run.get(updates[a.worker].key)) for a in item.accepted if a.worker in updates]
        if len(blobs) < len(item.accepted):
            return []  # a missing update is a finding of the ledger check already
        expected = _expected(old, [(s, tensors(b)) for s, b in blobs if b is not None], run.server_lr(rnd))
    return [Finding(round=rnd, kind="model", detail=d) for d in _compare(rnd, new, expected)]


def _expected(
    old: dict[str, np.ndarray], deltas: list[tuple[float, dict[str, np.ndarray]]], server_lr: float
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{name: (exact value, tolerance)} of model r+1, in float64."""
    total = sum(s for s, _ in deltas)
    n = len(deltas)
    out = {}
    for name, g in old.items():
        if np.issubdtype(g.dtype, np.integer):  # a count: the mean rounded half to even, no server_lr
            mean = sum(s * d[name].astype(np.float64) for s, d in deltas) / total if name in deltas[0][1] else 0
            info = np.iinfo(g.dtype)
            out[name] = (np.clip(g.astype(np.float64) + np.rint(mean), info.min, info.max), np.zeros(g.shape))
            continue
        g64 = g.astype(np.float64)
        if name not in deltas[0][1]:
            out[name] = (g64, np.zeros(g.shape))
            continue
        terms = [(s / total) * d[name].astype(np.float64) for s, d in deltas]
        step = server_lr * sum(terms)
        spread = server_lr * sum(np.abs(t) for t in terms)
        out[name] = (g64 + step, 2 * EPS32 * ((n + 2) * spread + np.abs(g64)) + TINY32)
    return out


def _compare(rnd: int, stored: dict[str, np.ndarray], expected: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[str]:
    problems = []
    if set(stored) != set(expected):
        problems.append(f"model {rnd + 1} has tensors {sorted(set(stored) ^ set(expected))} that model {rnd} lacks")
    for name in sorted(set(stored) & set(expected)):
        value, tol = expected[name]
        got = stored[name].astype(np.float64)
        if got.shape != value.shape:
            problems.append(f"model {rnd + 1} {name}: shape {got.shape}, expected {value.shape}")
            continue
        bad = ~(np.abs(got - value) <= tol)  # NaN is bad too
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            problems.append(
                f"model {rnd + 1} {name}: {int(bad.sum())} of {bad.size} values differ from the recomputed ones "
                f"(first at flat index {i}: stored {float(got.flat[i])!r}, expected {float(value.flat[i])!r} "
                f"+- {float(tol.flat[i]):.3g})"
            )
    return problems


# --------------------------------------------------------------------------- a local run's saved state


class SavedRunTable(RunTable):
    """A local run's saved items (smlt.snapshot), read as the run's table partition: the reads
    the reconciliation makes (get, get_many, query by prefix) over the list, in key order."""

    def __init__(self, run_id: str, items: list[dict[str, Any]]):
        super().__init__("saved", run_id)
        self._items = sorted((i for i in items if i.get("pk") == self.pk), key=lambda i: str(i["sk"]))
        self._by_sk = {i["sk"]: i for i in self._items}

    def _get(self, sk: str) -> dict[str, Any] | None:
        return self._by_sk.get(sk)

    def _get_batch(self, sks: list[str], found: dict[str, dict[str, Any] | None]) -> None:
        found.update({sk: self._by_sk.get(sk) for sk in sks})

    def query(self, prefix: str) -> list[dict[str, Any]]:
        return [i for i in self._items if str(i["sk"]).startswith(prefix)]

    def _query(self, condition: str, values: dict[str, Any]) -> list[dict[str, Any]]:
        raise NotImplementedError("a saved state is read by prefix only")


def reconcile_saved(out: Path, run_id: str) -> Reconciliation:
    """`reconcile` of a local run from its saved state in --out `out` (`smlt verify RUN --local`):
    the state is checked first (smlt.snapshot: item digests, models, dataset; DamagedState
    otherwise), then its items and its saved objects are reconciled as a bucket and a table
    would be. RunNotFound when `out` holds no such run."""
    from smlt.snapshot import artifacts_root, find_state, saved_items

    items = saved_items(run_id, out)
    root = artifacts_root(find_state(out, run_id), run_id)
    objects = SavedObjects(root if root is not None else find_state(out, run_id) / "s3")
    return _reconcile(_Run(objects, SavedRunTable(run_id, items), run_id))

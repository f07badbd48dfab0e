"""`smlt local up`: the local engine kept running as a console that the AWS CLI, plain boto3, the
`smlt start/status/stop` commands and `smlt dashboard` use like a deployed stack.

- One endpoint (moto's server on 127.0.0.1:PORT, a fixed port so it survives a restart) serves
  Step Functions, S3, DynamoDB and CloudFormation; a CloudFormation stack (default name "Smlt")
  carries the stack's outputs, so `Stack.lookup` (smlt/cloud.py) finds them as on AWS.
- Uploads to the data bucket fire the stack's own trigger rule: every new object is turned into
  the event S3 sends EventBridge and delivered by :mod:`smlt.local.eventbridge` (moto's S3 emits
  no events), so `incoming/<pipeline>/<version>/manifest.json`, or the `_SUCCESS` marker written
  after a version's raw data, starts a retraining run.
- The buckets' objects and the table's items are copied to the state folder every few seconds and
  when the console stops, and put back when it starts: the runs survive `down` and `up`.
  Executions do not (Step Functions state lives in memory): `down` stops the running ones, and
  `smlt resume RUN` continues such a run from its last complete round.

The serving process writes STATE/console.json (:class:`ConsoleInfo`) once it is ready and removes
it when it ends; `smlt local down` sends it SIGTERM. It holds an OS lock on STATE/lock, so two
consoles never share one state folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from smlt import stack_outputs
from smlt.datasets import cache_home
from smlt.folderlock import folder_lock, write_atomic
from smlt.local.eventbridge import UploadTrigger
from smlt.runtime.errors import SmltError
from smlt.runtime.progress import notice
from smlt.runtime.records import from_item, to_item

DEFAULT_PORT = 4575
DEFAULT_STACK = "Smlt"
INFO_FILE = "console.json"
SAVE_EVERY_S = 5.0


class ConsoleError(SmltError):
    """The console cannot start or stop (port taken, state folder in use, not running)."""


class ConsoleInfo(BaseModel):
    """What `smlt local up` prints and `down`, the dashboard and the tests read: where it is and
    the stack's outputs."""

    pid: int
    endpoint_url: str
    region: str
    stack: str
    state_machine_arn: str
    artifacts_bucket: str
    data_bucket: str
    table: str
    state_dir: str
    started_at: float

    def environment(self) -> dict[str, str]:
        """The variables that point the AWS CLI and boto3 at the console (dummy credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }

    def lines(self) -> list[str]:
        env = self.environment()
        return [
            f"smlt local console up (pid {self.pid}, state in {self.state_dir})",
            f"  endpoint:          {self.endpoint_url}  (Step Functions, S3, DynamoDB, CloudFormation)",
            f"  stack:             {self.stack}",
            f"  state machine:     {self.state_machine_arn}",
            f"  data bucket:       {self.data_bucket}",
            f"  artifacts bucket:  {self.artifacts_bucket}",
            f"  table:             {self.table}",
            "point the AWS CLI, boto3 and smlt at it:",
            *(f"  export {k}={v}" for k, v in env.items()),
            "then e.g.:",
            f"  aws stepfunctions start-execution --state-machine-arn {self.state_machine_arn} --input file://job.json",
            "  smlt dashboard --local",
        ]


def default_state_dir() -> Path:
    return cache_home() / "console"


def read_info(state: Path) -> ConsoleInfo | None:
    """The running console of a state folder, or None (no console.json, or its process is gone)."""
    path = state / INFO_FILE
    if not path.exists():
        return None
    info = ConsoleInfo.model_validate_json(path.read_text())
    return info if _alive(info.pid) else None


def _alive(pid: int) -> bool:
    try:  # our own child that has exited (a zombie until reaped) is not alive
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not our child
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the server binds it (werkzeug reuses the address): a port just freed is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ConsoleError(
                f"--port {port}: 127.0.0.1:{port} is in use; stop what listens there or give another --port"
            ) from None


def state_lock(state: Path) -> contextlib.AbstractContextManager[Path]:
    """The console's lock on its state folder (smlt.folderlock, as a local run's saved state)."""

    def busy(_: Path) -> ConsoleError:
        return ConsoleError(
            f"--state {state}: another console uses this folder; `smlt local down --state {state}` first"
        )

    return folder_lock(state, busy)


class SavedState:
    """The console's buckets and table in a folder: s3/<bucket>/<key>, s3.json (each object's
    ETag, so a save downloads only what changed) and items.json (every item of the table)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        index = folder / "s3.json"
        self.etags: dict[str, dict[str, str]] = json.loads(index.read_text()) if index.exists() else {}

    def save(self, s3: Any, ddb: Any, buckets: list[str], table: str) -> None:
        for bucket in buckets:
            self._save_bucket(s3, bucket)
        write_atomic(self.folder / "s3.json", json.dumps(self.etags))
        items: list[dict[str, Any]] = []
        for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
            items.extend(from_item(i) for i in page.get("Items", []))
        write_atomic(self.folder / "items.json", json.dumps(items, default=str))

    def _save_bucket(self, s3: Any, bucket: str) -> None:
        known = self.etags.setdefault(bucket, {})
        listed: dict[str, str] = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            listed.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
        root = self.folder / "s3" / bucket
        for key, etag in listed.items():
            if known.get(key) == etag:
                continue
            try:
                body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            except s3.exceptions.NoSuchKey:  # deleted since the listing
                continue
            path = root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, body)
            known[key] = etag
        for key in set(known) - set(listed):
            (root / key).unlink(missing_ok=True)
            del known[key]

    def restore(self, s3: Any, ddb: Any, table: str) -> int:
        """Put the saved objects and items back; returns the number of runs restored."""
        for bucket, objects in self.etags.items():
            for key in objects:
                path = self.folder / "s3" / bucket / key
                if path.exists():
                    s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        items_path = self.folder / "items.json"
        items = json.loads(items_path.read_text()) if items_path.exists() else []
        for i in range(0, len(items), 25):
            batch = [{"PutRequest": {"Item": to_item(item)}} for item in items[i : i + 25]]
            ddb.batch_write_item(RequestItems={table: batch})
        # A put's ETag is the body's MD5, as the original's was unless it was a multipart upload
        # (the AWS CLI's for files over 8 MB): such an object is read once more by the next save.
        return sum(1 for item in items if item["sk"] == "META" and str(item["pk"]).startswith("RUN#"))


class Console:
    """The engine, the stack's outputs in CloudFormation, the upload trigger and the saved state.
    ``start()``, then ``tick()`` every second or so, then ``stop()``."""

    def __init__(self, state: Path, port: int = DEFAULT_PORT, stack: str = DEFAULT_STACK) -> None:
        self.state, self.port, self.stack = state, port, stack
        self.saved = SavedState(state)
        self.engine: Any = None
        self.names: Any = None
        self.info: ConsoleInfo | None = None
        self.trigger: UploadTrigger | None = None
        self._last_save = 0.0
        self._server_held = False

    def start(self) -> ConsoleInfo:
        from smlt.local import server as server_mod
        from smlt.runner import start_engine

        _check_port_free(self.port)
        server_mod.acquire(self.port)  # the engine shares this server: its port is the console's
        self._server_held = True
        try:
            self.engine, self.names, _ = start_engine(None)
            runs = self.saved.restore(self.engine.client("s3"), self.engine.client("dynamodb"), self.names.table)
            if runs:
                notice.info(f"restored {runs} runs from {self.state}")
            self._publish_outputs()
            self.trigger = UploadTrigger(self.engine, self.names.data_bucket)
            self.trigger.prime()
        except BaseException:
            self.stop()
            raise
        self.info = ConsoleInfo(
            pid=os.getpid(),
            endpoint_url=self.engine.endpoint_url,
            region=self.engine.region,
            stack=self.stack,
            state_machine_arn=self.engine.state_machine_arn,
            artifacts_bucket=self.names.artifacts_bucket,
            data_bucket=self.names.data_bucket,
            table=self.names.table,
            state_dir=str(self.state.resolve()),
            started_at=time.time(),
        )
        write_atomic(self.state / INFO_FILE, self.info.model_dump_json(indent=2))
        return self.info

    def _publish_outputs(self) -> None:
        publish_outputs(self.engine, self.stack)

    def tick(self) -> None:
        """Fire the trigger for new uploads; save the state every SAVE_EVERY_S seconds."""
        assert self.trigger is not None
        self.trigger.poll()
        if time.monotonic() - self._last_save >= SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        s3, ddb = self.engine.client("s3"), self.engine.client("dynamodb")
        self.saved.save(s3, ddb, [self.names.artifacts_bucket, self.names.data_bucket], self.names.table)
        self._last_save = time.monotonic()

    def stop(self) -> None:
        """Save, stop the running executions and the engine. Safe after a failed start."""
        from smlt.local import server as server_mod

        try:
            if self.info is not None:
                self.save()
        finally:
            (self.state / INFO_FILE).unlink(missing_ok=True)
            self.info = None
            if self.engine is not None:
                self.engine.stop()
                self.engine = None
            if self._server_held:
                server_mod.release()
                self._server_held = False


def serve(state: Path, port: int = DEFAULT_PORT, stack: str = DEFAULT_STACK, interval: float = 1.0) -> None:
    """Run a console in this process until SIGTERM or SIGINT (what `smlt local up` starts)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with state_lock(state):
        console = Console(state, port, stack)
        info = console.start()
        for line in info.lines():
            notice.info(line)
        try:
            while not stop.wait(interval):
                console.tick()
        finally:
            console.stop()
            notice.info("smlt local console stopped (state saved)")


def up(state: Path, port: int = DEFAULT_PORT, stack: str = DEFAULT_STACK, timeout: float = 300.0) -> ConsoleInfo:
    """Start a console in a background process (its log: STATE/console.log) and wait until it is
    ready; a console already up in STATE is returned as it is."""
    running = read_info(state)
    if running is not None:
        return running
    state.mkdir(parents=True, exist_ok=True)
    (state / INFO_FILE).unlink(missing_ok=True)  # a stale one (its process is gone)
    log = open(state / "console.log", "ab")  # noqa: SIM115 - handed to the child
    cmd = [sys.executable, "-m", "smlt.cli", "local", "up", "--foreground"]
    cmd += ["--state", str(state), "--port", str(port), "--stack", stack]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        info = read_info(state)
        if info is not None and info.pid == proc.pid:
            return info
        if proc.poll() is not None:
            tail = (state / "console.log").read_text(errors="replace").strip().splitlines()[-5:]
            raise ConsoleError("the console did not start:\n  " + "\n  ".join(tail))
        time.sleep(0.2)
    proc.terminate()
    raise ConsoleError(f"the console was not ready after {timeout:.0f} s (log: {state / 'console.log'})")


def down(state: Path, timeout: float = 120.0) -> ConsoleInfo:
    """Stop the console of STATE (it saves its state first); returns what it was."""
    info = read_info(state)
    if info is None:
        raise ConsoleError(f"no console is up with --state {state}")
    os.kill(info.pid, signal.SIGTERM)
    t0 = time.monotonic()
    while _alive(info.pid):
        if time.monotonic() - t0 > timeout:
            raise ConsoleError(f"the console (pid {info.pid}) did not stop within {timeout:.0f} s")
        time.sleep(0.1)
    return info


def publish_outputs(engine: Any, stack: str) -> None:
    """A CloudFormation stack named `stack` on the engine's endpoint whose outputs are the
    synthesized stack's, resolved to the engine's names (what `Stack.lookup` and `smlt tune`
    read): the console's, and tests' of the deployed path."""
    values = engine.outputs()
    missing = sorted(set(stack_outputs.REQUIRED) - set(values))
    assert not missing, f"the synthesized stack lacks outputs {missing}"
    template = {
        # CloudFormation needs one resource; the outputs are what matters.
        "Resources": {"Outputs": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {k: {"Value": v} for k, v in values.items()},
    }
    engine.client("cloudformation").create_stack(StackName=stack, TemplateBody=json.dumps(template))

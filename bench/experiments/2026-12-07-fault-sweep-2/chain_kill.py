"""A long run (rounds_per_execution 4) whose Chain step dies (`kill`: after StartExecution, before
it answers; `crash:K`: right after its K-th write), or (TARGET `plan`) the first Plan of the
continuation. Run from the worktree root:
python bench/experiments/2026-12-07-fault-sweep-2/chain_kill.py ACTION OUT [chain|plan]"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
os.environ.setdefault("SMLT_HOME", "/tmp/dmf/home")
os.environ.update(
    {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
)

from smlt.datasets import stage_dataset  # noqa: E402
from smlt.runner import RunFailed, execute, start_engine  # noqa: E402
from tests.e2e.test_local_run import digits_job  # noqa: E402

action, out = sys.argv[1], Path(sys.argv[2])
target = sys.argv[3] if len(sys.argv) > 3 else "chain"
job = digits_job(max_rounds=10, target_value=None, local_steps=2)
job["workers"].update(initial=2)
job["rounds_per_execution"] = 4
engine, names, _ = start_engine(None)
job = {**job, "dataset": {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}}
seen = {"n": 0}


def filt(function, payload):
    if not isinstance(payload, dict):
        return "ok"
    if (
        target == "chain"
        and payload.get("op") == "chain"
        or (
            target == "plan"
            and payload.get("op") == "plan"
            and str(payload.get("execution", "")).endswith("chainkill-r000004")
        )
    ):
        seen["n"] += 1
        if seen["n"] == 1 and action != "none":
            return action
    return "ok"


engine.invoke_filter = filt
run_id = "chainkill"
try:
    m = execute(engine, names, run_id, job, out)
    print("RESULT rc=0 rounds", m["final"]["rounds"], [r["round"] for r in m["rounds"]], m["final"]["val_accuracy"])
except RunFailed as e:
    print("RESULT rc=1", e)
sfn = engine.client("stepfunctions")
time.sleep(20)
arn = sfn.list_state_machines()["stateMachines"][0]["stateMachineArn"]
for ex in sfn.list_executions(stateMachineArn=arn)["executions"]:
    print("EXEC", ex["name"], ex["status"])
print("TARGET invocations", target, seen["n"])
ddb = engine.client("dynamodb")
items = ddb.query(
    TableName=names.table, KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": f"RUN#{run_id}"}}
)["Items"]
print("META", [i.get("status", {}).get("S") for i in items if i["sk"]["S"] == "META"])
print("ROUNDS", sorted(i["sk"]["S"] for i in items if i["sk"]["S"].startswith("ROUND")))

"""One round of the state machine, one module per state, in the machine's order.

Read `infra/stacks/workflow.py` (the states and their wiring), then:

- `prepare`   PrepareData, before the first Plan of a raw upload: its data prepared into a dataset
- `plan`      Plan (and Chain): validate the job, decide the round, write the PLAN item
- `train`     Train, one Map iteration per worker: k local steps, the update, the WORKER record
- `aggregate` Aggregate: seal the round, average the updates into model r+1, the ROUND item
- `finalize`  Finalize: the final model and metrics

Their edges are typed: `events` (what the state machine sends each function and the answer it
reads back) and `smlt.runtime.items` (the DynamoDB items they read and write, through `smlt.runtime.records`).
The Lambda handlers in `lambdas/` are thin: parse the event, call the step, dump its answer.
"""

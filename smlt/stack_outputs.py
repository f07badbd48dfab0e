"""The names of the stack's CloudFormation outputs: the stack declares them
(infra/stacks/smlt_stack.py), the CLI looks them up (smlt.cloud, smlt.studies), the console publishes
the local engine's (smlt.console), the engine picks the training machine by one (smlt.local.resolve)."""

STATE_MACHINE = "StateMachineArn"
STUDY_STATE_MACHINE = "StudyStateMachineArn"
DATA_BUCKET = "DataBucketName"
ARTIFACTS_BUCKET = "ArtifactsBucketName"
TABLE = "TableName"
DASHBOARD_URL = "DashboardUrl"
REDIS_ENDPOINT = "RedisEndpoint"

# What every command on a deployed stack needs, by the `smlt.cloud.Stack` field that holds it.
REQUIRED = {
    STATE_MACHINE: "state_machine_arn",
    ARTIFACTS_BUCKET: "artifacts_bucket",
    DATA_BUCKET: "data_bucket",
    TABLE: "table",
}

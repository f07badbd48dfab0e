"""Named errors. A Lambda raising one of these fails with `errorType` = the class name, which
is the `Error` Step Functions sees, so the state machine and the user see the same name."""

from __future__ import annotations


class SmltError(Exception):
    """Base of smlt's named errors."""


class InvalidJob(SmltError):
    """The execution input does not validate; the message names the field."""


class InvalidCode(InvalidJob):
    """The user's code (`--code DIR`) cannot be packaged, fetched, verified or imported."""


class InvalidDataset(SmltError):
    """The dataset is missing, unreadable, corrupt or does not match the model."""


class CorruptShard(InvalidDataset):
    """A dataset shard is missing, does not match its manifest digest, or cannot be parsed.

    A worker raises it for the shard it could not read (`key`, relative to the dataset, and
    `reason`: "digest", "missing" or "unreadable"); the run fails with it when the shard fails
    again on the next attempt, by another worker."""

    def __init__(
        self, message: str, key: str = "", reason: str = "", split: str | None = None, index: int | None = None
    ) -> None:
        super().__init__(message)
        self.key, self.reason, self.split, self.index = key, reason, split, index


class ModelTooLarge(SmltError):
    """The model does not fit the memory tier chosen for the workers."""


class AccessDenied(SmltError):
    """The stack may not read or write the location named in the job."""


class Diverged(SmltError):
    """Training produced NaN/Inf and the fallback (last good model, halved LR) did not help."""


class Infeasible(SmltError):
    """The planner predicts the deadline or budget cannot be met and best_effort is off."""


class ConcurrencyLimit(Infeasible):
    """The job pins more workers at once than the account's Lambda concurrency (or the stack's
    `max_concurrency`) lets run: refused before anything is spent (smlt.runtime.account)."""


class StaleInvocation(SmltError):
    """A worker invocation for a round that is already aggregated (late or duplicated)."""


class QuorumNotReached(SmltError):
    """Too few workers of a round reported, on every attempt."""


class ChainedExecutionFailed(SmltError):
    """The execution that continues a run (its name derives from the round) exists and failed,
    timed out or was aborted: the run does not go on by itself."""


class StackNotFound(SmltError):
    """The named CloudFormation stack does not exist or lacks smlt's outputs (CLI only)."""


class RunNotFound(SmltError):
    """The run named on the command line has no record (table or saved local state) (CLI only)."""


class AwsNotConfigured(SmltError):
    """No AWS region or credentials for a command against a deployed stack (CLI only)."""


class RunNotFinished(SmltError):
    """A run's outputs were asked for before the run wrote its final metrics (CLI only)."""


class RunInProgress(SmltError):
    """Another execution drives this run id (one driver per run: the first execution claims it in
    META, Chain hands it over, a resume takes it over only from an execution that has ended), or
    a local run with this run id is already live in the same --out folder."""


class AlreadyFinished(SmltError):
    """An execution was started for a run id whose run has finished: nothing is trained again."""


class DataError(SmltError):
    """The same error on the same shard twice (two invocations, on different workers when there is
    more than one), or a shard whose inputs are NaN or Inf (on any worker at once): the shard, not
    the platform or the learning rate, is the cause."""


class StoreUnavailable(SmltError):
    """The exchange store (Redis) stayed unreachable for longer than a failover takes."""


class Throttled(SmltError):
    """An S3 or DynamoDB request of a control step (Plan, Aggregate and its ops, Finalize,
    PrepareData, the steps after a table's parts) still throttled after botocore's attempts (S3's
    503 SlowDown, DynamoDB's ProvisionedThroughputExceededException, ThrottlingException or
    RequestLimitExceeded). The message names the service, the request and the object or table.
    The state machine retries the step (idempotent) after a pause; a run that fails with it is
    resumed (`smlt resume`)."""


class PartialData(SmltError):
    """The run ended without training some train shards at all, and the job does not allow it
    (`training.allow_partial_data`)."""


class RunFailed(SmltError):
    """A local run's execution ended in a status other than SUCCEEDED (CLI only)."""

    def __init__(self, run_id: str, status: str, error: str, cause: str) -> None:
        super().__init__(f"run {run_id} {status}: {error}")
        self.run_id, self.status, self.error, self.cause = run_id, status, error, cause


class DigestMismatch(SmltError):
    """A stored model or update does not match the sha256 recorded beside its item (a damaged or
    replaced object): never averaged, never published. `key` names the object, `expected` the
    digest recorded when it was written, `actual` the stored object's."""

    def __init__(self, message: str, key: str = "", expected: str = "", actual: str = "") -> None:
        super().__init__(message)
        self.key, self.expected, self.actual = key, expected, actual


class DamagedState(SmltError):
    """A saved local state that cannot be resumed as it is (a round missing, an object whose digest
    does not match its item, META missing); nothing is restored from it (CLI only)."""


class UserCodeError(SmltError):
    """The user's own code (`--code`, a model builder, its forward pass, a `code.transform`) raised,
    while being imported, building the model, running the forward pass or the transform.
    Deterministic: never retried. Two forms: the worker's, one message already holding the
    exception and the frames (`UserCodeError(text)`); the client check's, `type` and `message` of
    the exception, `frames` the last frames inside the user's files ("file:line in function: source
    line", innermost last) and `where` what smlt was doing."""

    def __init__(self, type: str, message: str | None = None, frames: list[str] | None = None, where: str = "") -> None:
        if message is None:  # the worker's form: the whole text
            self.type, self.message, self.frames, self.where = "", type, list(frames or []), where
            super().__init__(type)
            return
        self.type, self.message, self.frames, self.where = type, message, list(frames or []), where
        head = f"{where}: " if where else ""
        lines = [f"{head}your code raised {type}: {message}"] + [f"  {f}" for f in self.frames]
        super().__init__("\n".join(lines))


class StudyFailed(SmltError):
    """A study ended without any trial producing a model (CLI only): `causes` maps each trial to why."""

    def __init__(self, message: str, causes: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.causes = dict(causes or {})


# What a user-code error's cause says to do (the CLI adds no second line when a cause holds it).
FIX_AND_START_AGAIN = "(fix your code and start the run again: a resume would run the same code)"

# A run that failed with one of these would fail the same way when resumed: it is started again
# once the cause (the job, the data, the user's code) is fixed. The one list the local CLI
# (`smlt run --local`, `smlt resume --local`) and `smlt status` on a stack both read.
START_AGAIN = frozenset(
    {
        "InvalidJob",
        "InvalidCode",
        "InvalidDataset",
        "CorruptShard",
        "DataError",
        "UserCodeError",
        "ModelTooLarge",
        "AccessDenied",
        "PartialData",
        "RunInProgress",
        "AlreadyFinished",
        "Infeasible",
        "DamagedState",
        "Diverged",  # the learning rate already halved in META, the same round diverges again
    }
)


def after_failure(error: str, cause: str, resume_command: str) -> str | None:
    """What to do about a run that failed with `error` (its cause `cause`): start it again once the
    cause is fixed (None when the cause says so already), or the command that resumes it."""
    if error in START_AGAIN:
        if FIX_AND_START_AGAIN in cause:  # a user-code error's cause already says it
            return None
        return "a resume would fail the same way: fix the cause and start the run again"
    return f"continue it from its last complete round with: {resume_command}"

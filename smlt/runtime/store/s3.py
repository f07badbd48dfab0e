"""S3 store. Conditional writes (If-None-Match: *) give first-writer-wins for retried steps.

Only 412 PreconditionFailed means "already exists". A 409 ConditionalRequestConflict means
another conditional write to the key was in flight: nothing may be stored yet, so the write is
retried (smlt/runtime/retry.py) until it either lands or meets the other writer's object (412).
"""

from __future__ import annotations

import os
import re
from typing import Any

from botocore.exceptions import ClientError

from smlt.runtime import clients
from smlt.runtime.errors import AccessDenied, DataError
from smlt.runtime.retry import S3_CONFLICTS, error_code, on_conflict
from smlt.runtime.store.base import NotFound


def s3_client() -> Any:
    return clients.client("s3")


def _missing(e: ClientError) -> bool:
    return e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound")


# AWS's 403 message in the same account: "User: arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION is not
# authorized to perform: ACTION on resource: ARN because ..." (a HEAD's 403 has no body at all).
_ROLE = re.compile(r"assumed-role/([^/\s]+)/")
_ACTION = re.compile(r"perform: ([a-z0-9-]+:[A-Za-z]+) on resource: \"?([^\s\"]+)")
DATA_BUCKETS_DOC = 'docs/deploy.md, "Datasets in your own buckets"'


def _denied(e: ClientError, uri: str, what: str) -> AccessDenied | None:
    """A 403 as a named error: in a function, the role, the action AWS refused and the stack's
    setting that grants it; elsewhere, the user's credentials."""
    err = e.response.get("Error", {})
    if err.get("Code") not in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
        return None
    function = os.environ.get("AWS_LAMBDA_FUNCTION_NAME")
    if not function:
        return AccessDenied(
            f"{uri}: your AWS credentials may not {what} it (S3 answered 403 AccessDenied): allow it for your user "
            "or role (`aws sts get-caller-identity` names them), or use a profile that may (AWS_PROFILE)"
        )
    message = str(err.get("Message") or "")
    role = _ROLE.search(message)
    who = f"role {role.group(1)} (function {function})" if role else f"the role of function {function}"
    action = _ACTION.search(message)
    if action and action.group(1) == "kms:Decrypt":
        key = action.group(2)
        return AccessDenied(
            f"{uri}: {who} may not decrypt it: the object is encrypted with KMS key {key} and the role has no "
            f"kms:Decrypt on it (S3 answered 403 AccessDenied); add the key's ARN to the stack's cdk context "
            f'data_kms_keys (cdk.json "data_kms_keys": ["{key}"]) and deploy again; a key of another account '
            f"must also allow the role in its key policy ({DATA_BUCKETS_DOC})"
        )
    refused = f"{action.group(1)}; " if action else ""
    bucket = uri.removeprefix("s3://").partition("/")[0]
    own = {os.environ.get("SMLT_DATA_BUCKET"), os.environ.get("SMLT_ARTIFACTS_BUCKET")} - {None, ""}
    if own and bucket not in own:
        return AccessDenied(
            f"{uri}: {who} may not {what} it ({refused}S3 answered 403 AccessDenied): s3://{bucket} is not one of "
            f"the stack's buckets; give the stack read access to it with cdk context data_buckets (cdk.json "
            f'"data_buckets": ["{bucket}"]) and deploy again; a bucket of another account must also allow '
            f"the role in its bucket policy, and an object encrypted with your own KMS key needs that key in "
            f"data_kms_keys ({DATA_BUCKETS_DOC})"
        )
    return AccessDenied(
        f"{uri}: {who} may not {what} it ({refused}S3 answered 403 AccessDenied); the stack grants each function "
        "its prefixes in infra/stacks/functions.py, and the objects encrypted with your own KMS key need that "
        f"key in cdk context data_kms_keys ({DATA_BUCKETS_DOC})"
    )


# S3's answers to a request sent to another region than its bucket's (botocore follows them to the
# bucket's region; one reaches the caller when it cannot: a second redirect, an endpoint of its own).
WRONG_REGION = ("PermanentRedirect", "AuthorizationHeaderMalformed", "301", "IllegalLocationConstraintException")


def bucket_region(e: ClientError) -> str | None:
    """The bucket's region a wrong-region answer names (its Region field, its endpoint or the
    x-amz-bucket-region header), None when it names none."""
    err = e.response.get("Error", {})
    headers = e.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    if err.get("Region"):
        return str(err["Region"])
    if headers.get("x-amz-bucket-region"):
        return str(headers["x-amz-bucket-region"])
    found = re.search(r"s3[.-]([a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws", str(err.get("Endpoint", "")))
    return found.group(1) if found else None


def _elsewhere(e: ClientError, uri: str) -> DataError | None:
    """A wrong-region answer to a function as what to do (on the user's machine the caller says
    it: `smlt.aws_errors`)."""
    if e.response.get("Error", {}).get("Code") not in WRONG_REGION or not os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        return None
    here = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "this region"
    there = bucket_region(e) or "another region"
    return DataError(
        f"{uri}: the bucket is in {there}, not {here} (S3 answered {e.response['Error']['Code']}): copy the "
        f"dataset into a bucket in {here} (`aws s3 sync s3://SRC s3://DEST --source-region {there}`), the stack's "
        "region; a stack with redis_reducer reaches S3 only through its VPC's gateway endpoint, which serves "
        f"buckets of its own region only ({DATA_BUCKETS_DOC})"
    )


def _refused(e: ClientError, uri: str, what: str) -> AccessDenied | DataError | None:
    """A 403 or a wrong-region answer as its named error (`_denied`, `_elsewhere`), else None."""
    return _denied(e, uri, what) or _elsewhere(e, uri)


class S3Store:
    def __init__(self, bucket: str, prefix: str = "", client=None):
        self.bucket = bucket
        self.prefix = prefix
        self._client = client

    @property
    def client(self):
        return self._client or s3_client()

    def _k(self, key: str) -> str:
        return self.prefix + key

    def _uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._k(key)}"

    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
        except ClientError as e:
            if _missing(e):
                raise NotFound(self._uri(key)) from None
            refused = _refused(e, self._uri(key), "read")
            if refused is not None:
                raise refused from None
            raise

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._k(key), Range=f"bytes={start}-{end - 1}")
            return resp["Body"].read()
        except ClientError as e:
            if _missing(e):
                raise NotFound(self._uri(key)) from None
            refused = _refused(e, self._uri(key), "read")
            if refused is not None:
                raise refused from None
            raise

    def put(self, key: str, data: bytes, *, if_absent: bool = False, tagging: str | None = None) -> bool:
        """`tagging` ("k=v&k2=v2") lets lifecycle rules find objects prefixes cannot describe."""
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        if tagging:
            extra["Tagging"] = tagging

        def attempt() -> bool:
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data, **extra)
                return True
            except ClientError as e:
                if if_absent and error_code(e) in ("PreconditionFailed", "412"):
                    return False
                raise

        return on_conflict(attempt, S3_CONFLICTS)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._k(key))
            return True
        except ClientError as e:
            if _missing(e):
                return False
            refused = _refused(e, self._uri(key), "read")
            if refused is not None:
                raise refused from None
            raise

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Keys under prefix in key order; with start_after, only the keys after that one."""
        keys: list[str] = []
        extra = {"StartAfter": self._k(start_after)} if start_after else {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._k(prefix), **extra
        )
        try:
            for page in pages:
                keys.extend(o["Key"][len(self.prefix) :] for o in page.get("Contents", []))
        except ClientError as e:
            refused = _refused(e, self._uri(prefix), "list")
            if refused is not None:
                raise refused from None
            raise
        return keys

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._k(key))

    def copy(self, src_key: str, dst_key: str) -> None:
        self.client.copy_object(
            Bucket=self.bucket, Key=self._k(dst_key), CopySource={"Bucket": self.bucket, "Key": self._k(src_key)}
        )

"""botocore's errors on this machine, said for the user: no region, no credentials, no network,
a 403 on an object, or a request AWS refused. (A Lambda function's own 403 speaks of its role:
`smlt.runtime.store.s3`.)"""

from __future__ import annotations

import re
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from smlt.runtime.errors import AccessDenied, AwsNotConfigured, SmltError
from smlt.runtime.store import NotFound
from smlt.runtime.store.s3 import DATA_BUCKETS_DOC, WRONG_REGION, bucket_region

# S3's answers to credentials it does not take (expired, mistyped, of another partition).
REFUSED_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken")
DENIED = ("AccessDenied", "AccessDeniedException", "403", "Forbidden", "UnauthorizedOperation")


def aws_not_configured(e: Exception) -> AwsNotConfigured | None:
    """botocore's error for a missing region, missing credentials or an endpoint it cannot reach,
    as what to do; None for any other error."""
    if isinstance(e, NoRegionError):
        return AwsNotConfigured(
            "no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION), or `region` in ~/.aws/config, "
            "to the region the stack is deployed in"
        )
    if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
        return AwsNotConfigured(
            "no AWS credentials: run `aws configure` (or `aws sso login`), or set AWS_PROFILE "
            "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    if isinstance(e, EndpointConnectionError):
        url = str(e.kwargs.get("endpoint_url", "the endpoint")).rstrip("/")
        if ".amazonaws.com" in url:  # AWS itself: the network, not the console
            return AwsNotConfigured(
                f"cannot reach {url}: check this machine's network connection (and HTTPS_PROXY if it needs a proxy)"
            )
        return AwsNotConfigured(
            f"cannot reach {url}: is the local console up (`smlt local up`)? Else check AWS_ENDPOINT_URL / --endpoint-url"
        )
    return None


def user_get(store: Any, key: str, field: str, error: type[SmltError]) -> bytes:
    """An object read with this machine's credentials (`field`: what names it, such as
    `dataset.uri`). NotFound passes through; a 403, refused credentials, a missing bucket and a
    missing region, credentials or network are named for the user (`error`: the class of the
    object's own problems)."""
    uri = f"s3://{store.bucket}/{store.prefix}{key}"
    try:
        return bytes(store.get(key))
    except NotFound:
        raise
    except AccessDenied:
        raise AccessDenied(
            f"{field}: your AWS credentials may not read {uri} (S3 answered 403 AccessDenied): allow "
            "s3:GetObject on it for your user or role, or use a profile that may (AWS_PROFILE)"
        ) from None
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise error(f"{field}: no bucket {store.bucket!r} (reading {uri})") from None
        if code in WRONG_REGION:
            raise error(
                f"{field}: s3://{store.bucket} is in {bucket_region(e) or 'another region'}, not "
                f"{store.client.meta.region_name or 'your region'} (S3 answered {code} reading {uri}): copy "
                "the dataset into a bucket in the stack's region (`aws s3 sync SRC DEST --source-region REGION`) "
                f"({DATA_BUCKETS_DOC})"
            ) from None
        if code in REFUSED_CREDENTIALS:
            raise AccessDenied(
                f"{field}: S3 refused your AWS credentials reading {uri} ({code}): renew them (`aws sso login`, "
                "`aws configure`) or choose the profile that reads this bucket (AWS_PROFILE)"
            ) from None
        raise error(f"{field}: cannot read {uri}: {code}: {e}") from None
    except BotoCoreError as e:
        raise aws_not_configured(e) or error(f"{field}: cannot read {uri}: {e}") from None


# The IAM action of each operation the CLI and `smlt doctor` call (named when AWS's 403 does not
# name it, as a 403 from another account's resource or a HEAD's bodiless 403 do not).
CLI_ACTIONS = {
    "DescribeStacks": "cloudformation:DescribeStacks",
    "DescribeStackResources": "cloudformation:DescribeStackResources",
    "StartExecution": "states:StartExecution",
    "DescribeExecution": "states:DescribeExecution",
    "ListExecutions": "states:ListExecutions",
    "GetExecutionHistory": "states:GetExecutionHistory",
    "GetItem": "dynamodb:GetItem",
    "Query": "dynamodb:Query",
    "PutItem": "dynamodb:PutItem",
    "UpdateItem": "dynamodb:UpdateItem",
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "ListObjectsV2": "s3:ListBucket",
    "GetAccountSettings": "lambda:GetAccountSettings",
    "GetFunctionConfiguration": "lambda:GetFunctionConfiguration",
}
# AWS's 403 message: "User: ARN is not authorized to perform: ACTION on resource: ARN because ..."
_REFUSED = re.compile(r"User: (\S+) is not authorized to perform: (\S+?)(?: on resource: \"?([^\s\"]+)\"?)?(?: |$)")
WHAT_THE_CLI_NEEDS = 'docs/deploy.md, "What the CLI\'s user needs"'


def denied_message(e: ClientError, resource: str = "") -> str | None:
    """A 403 to this machine's credentials as what to do: who was refused, which IAM action on
    which resource (from AWS's message, else the operation's action and `resource`) and where
    the policy the CLI needs is written; None for any other error."""
    err = e.response.get("Error", {})
    code, message = err.get("Code", "?"), str(err.get("Message") or "")
    if code not in DENIED:
        return None
    found = _REFUSED.search(message)
    who = found.group(1) if found else "the credentials in use (`aws sts get-caller-identity` names them)"
    action = found.group(2) if found else CLI_ACTIONS.get(e.operation_name, e.operation_name)
    on = (found.group(3) if found else None) or resource
    why = re.search(r"(because .*|with an explicit deny .*)$", message) if found else None
    said = f" ({why.group(1).rstrip('.')})" if why else f" (AWS: {message})" if message and not found else ""
    return (
        f"AWS refused {e.operation_name} ({code}): {who} may not {action}{f' on {on}' if on else ''}{said}: allow "
        f"it in that user's or role's IAM policy, or use a profile that may (AWS_PROFILE) ({WHAT_THE_CLI_NEEDS})"
    )


def cli_message(e: Exception) -> str | None:
    """botocore's error that reached the command line as one line saying what to do; None for
    any other error."""
    if not isinstance(e, (BotoCoreError, ClientError)):
        return None
    named = aws_not_configured(e)
    if named is not None:
        return str(named)
    if isinstance(e, ClientError):
        denied = denied_message(e)
        if denied is not None:
            return denied
        err = e.response.get("Error", {})
        code, message = err.get("Code", "?"), err.get("Message", "")
        if code in WRONG_REGION:
            return (
                f"AWS refused {e.operation_name}: {code}: the bucket is in {bucket_region(e) or 'another region'}: "
                "set AWS_REGION to the stack's region, and keep the datasets you pass in buckets of that region "
                f"({DATA_BUCKETS_DOC})"
            )
        return f"AWS refused {e.operation_name}: {code}{f' ({message})' if message else ''}"
    return f"AWS: {type(e).__name__}: {e}"

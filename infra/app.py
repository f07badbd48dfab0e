"""The smlt CDK app.

    build_app(outdir=None, context=None) -> aws_cdk.App

Context precedence (low → high): cdk.json "context" (read here, so in-process callers get the same
defaults as the CDK CLI), the CLI's context (`-c key=value`, cdk.context.json), then `context`.
The app carries the cdk-nag AwsSolutions checks as a validation plugin: an unacknowledged finding
fails `app.synth()`.

In-process use (the local engine): `build_app(outdir=tmp, context={"aws:cdk:bundling-stacks": []})
.synth()` needs neither Docker nor the network: the layer is not built, the train_step image is
only staged (copied per .dockerignore), and Lambda resources carry `aws:asset:path` metadata.
"""

from __future__ import annotations

import json
import os
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.stacks.smlt_stack import SmltStack
from smlt.runtime import deployed

STACK_ID = "Smlt"
BUNDLING_STACKS = "aws:cdk:bundling-stacks"
ASSET_METADATA = "aws:cdk:enable-asset-metadata"
CFN_VALIDATE = "smlt:cfn-validate"
BUNDLE = "smlt:bundle"


def cdk_json_context() -> dict[str, Any]:
    return deployed.context()


def build_app(outdir: str | None = None, context: dict[str, Any] | None = None) -> cdk.App:
    defaults = cdk_json_context()
    defaults.setdefault(ASSET_METADATA, True)
    final = dict(context or {})
    cli = json.loads(os.environ.get("CDK_CONTEXT_JSON") or "{}")  # what the CDK CLI passes
    merged = {**defaults, **cli, **final}
    # The CLI refuses user context keys starting with "aws:"; `-c smlt:bundle=false` skips
    # bundling (the layer is not built: synth needs no package index; such an assembly
    # must not be deployed).
    if str(merged.get(BUNDLE, "true")).lower() == "false":
        final[BUNDLING_STACKS] = []
    # CDK's built-in "CloudFormation Validate" plugin costs 5-9 s per synth (the tests run
    # cfn-lint instead); turn it on with `-c smlt:cfn-validate=true`.
    cfn_validate = str(merged.get(CFN_VALIDATE, "false")).lower() == "true"
    app = cdk.App(
        outdir=outdir,
        context=defaults,
        post_cli_context=final,
        builtin_cloud_formation_validation=cfn_validate,
    )
    SmltStack(
        app,
        STACK_ID,
        description="smlt: serverless adaptive training on Lambda + Step Functions",
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


if __name__ == "__main__":
    build_app().synth()

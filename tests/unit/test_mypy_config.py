"""mypy follows only the CDK modules smlt's code imports (pyproject's [[tool.mypy.overrides]]):
a module imported without being listed there would be Any to mypy, unchecked."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPORT = re.compile(r"^\s*(?:from\s+aws_cdk(?:\.(\w+))?\s+import\s+(\([^)]*\)|.+)|import\s+aws_cdk(?:\.(\w+))?)", re.M)


def imported_cdk_modules() -> set[str]:
    found = set()
    for folder in ("smlt", "lambdas", "infra"):
        for path in (ROOT / folder).rglob("*.py"):
            for sub, names, plain in IMPORT.findall(path.read_text()):
                found.add("aws_cdk" + (f".{sub or plain}" if sub or plain else ""))
                # `from aws_cdk import aws_s3 as s3`: a module, not a name of aws_cdk's own
                found |= {f"aws_cdk.{n}" for n in re.findall(r"\b(aws_\w+)\s+as\b", names)}
    return found


def test_every_cdk_module_smlt_imports_is_followed_by_mypy():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    followed = {m for o in config["overrides"] if o.get("follow_imports") == "normal" for m in o["module"]}
    imported = imported_cdk_modules()
    assert {"aws_cdk", "aws_cdk.aws_lambda", "aws_cdk.aws_stepfunctions"} <= imported  # the scan works
    assert imported - followed == set()

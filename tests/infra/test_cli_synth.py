"""`npx cdk synth` with the pinned CLI (skipped where `npm ci` has not been run, e.g. CI)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CDK = REPO / "node_modules" / ".bin" / "cdk"


def test_cli_is_pinned():
    pkg = json.loads((REPO / "package.json").read_text())
    assert pkg["devDependencies"]["aws-cdk"] == "2.1148.1"
    lock = json.loads((REPO / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/aws-cdk"]["version"] == "2.1148.1"


@pytest.mark.skipif(not CDK.exists(), reason="run `npm ci` to install the pinned CDK CLI")
def test_cdk_cli_synth_offline(tmp_path):
    env = {
        **os.environ,
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    proc = subprocess.run(
        [str(CDK), "synth", "--no-notices", "--quiet", "-c", "smlt:bundle=false", "--output", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    template = json.loads((tmp_path / "Smlt.template.json").read_text())
    assert any(r["Type"] == "AWS::StepFunctions::StateMachine" for r in template["Resources"].values())

"""A stand-in for a CDK app with the shape smlt.local.synth.synthesize reads (``app.synth()``:
an assembly with ``directory`` and ``stacks``), so the synth cache's tests need no CDK.

``synth()`` writes a template naming one zip asset, the asset's folder, and a manifest into the
outdir, after ``SLOW_S`` seconds (the environment's ``FAKE_SYNTH_SLOW_S``: concurrent writers
overlap), and appends a line to ``$FAKE_SYNTH_LOG`` when that is set (how often it ran).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

STACK = "Fake"


class FakeApp:
    def __init__(self, outdir: str, context: dict[str, Any]) -> None:
        self.outdir, self.context = Path(outdir), context

    def synth(self) -> SimpleNamespace:
        time.sleep(float(os.environ.get("FAKE_SYNTH_SLOW_S", "0")))
        if os.environ.get("FAKE_SYNTH_LOG"):
            with open(os.environ["FAKE_SYNTH_LOG"], "a") as f:
                f.write(f"{os.getpid()}\n")
        template = {
            "Resources": {
                "Fn": {
                    "Type": "AWS::Lambda::Function",
                    "Properties": {"Handler": "index.handler", "Description": str(self.context.get("label"))},
                    "Metadata": {"aws:asset:path": "asset.abc"},
                }
            }
        }
        (self.outdir / "asset.abc").mkdir()
        (self.outdir / "asset.abc" / "index.py").write_text("def handler(event, context):\n    return event\n")
        path = self.outdir / f"{STACK}.template.json"
        path.write_text(json.dumps(template))
        (self.outdir / "manifest.json").write_text(json.dumps({"version": "fake"}))
        stack = SimpleNamespace(stack_name=STACK, id=STACK, template=template, template_full_path=str(path))
        return SimpleNamespace(directory=str(self.outdir), stacks=[stack])


def build_app(outdir: str, context: dict[str, Any]) -> FakeApp:
    return FakeApp(outdir, context)

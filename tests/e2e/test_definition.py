"""The definition the local engine runs is the one `cdk synth` produced: same states, same
fields; only names and ARNs differ."""

import json
import re

ARN_OR_NAME = re.compile(r"arn:aws:[^\"]+|Smlt-[A-Za-z0-9-]+")


def _placeholders(definition_string_parts):
    """Join the synthesized Fn::Join parts, with every intrinsic replaced by a placeholder."""
    return "".join(p if isinstance(p, str) else "<REF>" for p in definition_string_parts)


def _shape(text: str) -> str:
    return ARN_OR_NAME.sub("<REF>", text)


def test_engine_runs_the_synthesized_definition(local):
    engine, _ = local
    template = engine.synthesized.template
    ((lid, sm),) = [
        (k, r)
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::StepFunctions::StateMachine" and k.startswith("Workflow")
    ]
    ds = sm["Properties"]["DefinitionString"]
    synthesized = _placeholders(ds["Fn::Join"][1]) if isinstance(ds, dict) else ds
    running = engine.client("stepfunctions").describe_state_machine(stateMachineArn=engine.state_machine_arn)[
        "definition"
    ]
    assert json.loads(running) == engine.resolver.definition()
    # Same text once names/ARNs on both sides are placeholders: nothing but names was changed.
    assert _shape(json.dumps(json.loads(running), sort_keys=True)) == _shape(
        json.dumps(json.loads(synthesized.replace("<REF>", "arn:aws:x")), sort_keys=True)
    )
    states = json.loads(running)["States"]
    assert {"Plan", "Train", "Aggregate", "Finalize"} <= set(states)
    assert states["TrainDistributed"]["ItemProcessor"]["ProcessorConfig"]["Mode"] == "DISTRIBUTED"

"""Resolve the synthesized DefinitionString to plain ASL and check it structurally."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

ACCOUNT, REGION = "123456789012", "us-east-1"
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": "amazonaws.com"}


def placeholder(template: dict[str, Any], logical_id: str, attr: str | None) -> str:
    """A stand-in value for Ref/GetAtt of a resource, shaped like the real thing."""
    if logical_id in PSEUDO:
        return PSEUDO[logical_id]
    typ = template["Resources"][logical_id]["Type"]
    if typ == "AWS::Lambda::Function":
        return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{logical_id}" if attr == "Arn" else logical_id
    if typ == "AWS::StepFunctions::StateMachine":
        arn = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{logical_id}"
        return logical_id if attr == "Name" else arn
    return f"arn:aws:placeholder:{REGION}:{ACCOUNT}:{logical_id}" if attr else logical_id


def resolve(template: dict[str, Any], node: Any) -> Any:
    """Resolve Ref / Fn::GetAtt / Fn::Join to placeholder strings; any other intrinsic raises."""
    if isinstance(node, list):
        return [resolve(template, n) for n in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key == "Ref":
            return placeholder(template, value, None)
        if key == "Fn::GetAtt":
            return placeholder(template, value[0], value[1])
        if key == "Fn::Join":
            delimiter, parts = value
            return delimiter.join(str(resolve(template, p)) for p in parts)
        if key.startswith("Fn::"):
            raise ValueError(f"unexpected intrinsic in the definition: {key}")
    return {k: resolve(template, v) for k, v in node.items()}


def definition(template: dict[str, Any]) -> dict[str, Any]:
    # the training machine (the study machine, infra/stacks/study.py, is checked by its own tests)
    (sm,) = [
        r
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::StepFunctions::StateMachine" and lid.startswith("Workflow")
    ]
    text = resolve(template, sm["Properties"]["DefinitionString"])
    return json.loads(text)


def scopes(defn: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (path, {StartAt, States}) in the definition: top level, Map processors, Parallel branches."""
    yield path or "/", defn
    for name, st in defn["States"].items():
        for key in ("ItemProcessor", "Iterator"):
            if key in st:
                yield from scopes(st[key], f"{path}/{name}/{key}")
        for i, branch in enumerate(st.get("Branches", [])):
            yield from scopes(branch, f"{path}/{name}/Branches/{i}")


def all_states(defn: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for _, scope in scopes(defn):
        for name, st in scope["States"].items():
            assert name not in out, f"state name {name!r} used twice"
            out[name] = st
    return out


def successors(st: dict[str, Any]) -> list[str]:
    nxt = [st["Next"]] if "Next" in st else []
    nxt += [c["Next"] for c in st.get("Choices", [])]
    nxt += [st["Default"]] if "Default" in st else []
    nxt += [c["Next"] for c in st.get("Catch", [])]
    return nxt


def structural_errors(defn: dict[str, Any]) -> list[str]:
    """Problems a valid ASL document cannot have: dangling Next, unreachable or dead-end states."""
    errors: list[str] = []
    for where, scope in scopes(defn):
        states = scope.get("States") or {}
        start = scope.get("StartAt")
        if start not in states:
            errors.append(f"{where}: StartAt {start!r} is not a state")
            continue
        for name, st in states.items():
            typ = st.get("Type")
            for n in successors(st):
                if n not in states:
                    errors.append(f"{where}/{name}: Next {n!r} does not exist in this scope")
            terminal = typ in ("Succeed", "Fail") or st.get("End") is True
            if typ == "Choice":
                if not st.get("Choices"):
                    errors.append(f"{where}/{name}: Choice without Choices")
            elif not terminal and "Next" not in st:
                errors.append(f"{where}/{name}: neither Next nor End")
            if terminal and "Next" in st:
                errors.append(f"{where}/{name}: both terminal and Next")
        seen, todo = set(), [start]
        while todo:
            n = todo.pop()
            if n in seen or n not in states:
                continue
            seen.add(n)
            todo.extend(successors(states[n]))
        for name in states:
            if name not in seen:
                errors.append(f"{where}/{name}: unreachable from {start}")
    return errors

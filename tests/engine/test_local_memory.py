"""smlt.local.memory's compact DynamoDB items: moto answers every request the same whether its
items are held as objects or as bytes between requests."""

import sys

import pytest

from smlt.local import memory


def _key(sk):
    return {"pk": {"S": "p"}, "sk": {"S": sk}}


def _item(i):
    return {
        "n": {"N": str(i)},
        "f": {"N": f"{i / 7:.5f}"},
        "s": {"S": "x" * (i % 5)},
        "b": {"B": bytes([i % 256]) * 3},
        "t": {"BOOL": i % 2 == 0},
        "z": {"NULL": True},
        "ss": {"SS": [f"a{i}", "b"]},
        "ns": {"NS": ["1", str(i + 2)]},
        "bs": {"BS": [b"\x00\x01", bytes([i % 256]) + b"q"]},
        "m": {"M": {"k": {"N": "1"}, "em": {"M": {}}, "l": {"L": [{"S": "a"}, {"M": {"x": {"B": b"\xff"}}}]}}},
        "requests": {"M": {"s3.GetObject": {"N": str(i)}, "dynamodb.Query": {"N": "2"}}},
    }


def _workload(ddb):
    """Every kind of DynamoDB request moto serves from the items, their answers in order."""
    from botocore.exceptions import ClientError

    out = []

    def call(op, **kwargs):
        try:
            resp = getattr(ddb, op)(**kwargs)
            resp.pop("ResponseMetadata", None)
        except ClientError as e:
            resp = {"error": e.response["Error"]["Code"]}
        out.append((op, resp))

    for i in range(30):
        call("put_item", TableName="t", Item={**_key(f"ATTEMPT#{i // 3:06d}#{i % 3}"), **_item(i)})
    call("put_item", TableName="t", Item={**_key("ATTEMPT#000001#1"), **_item(99)}, ReturnValues="ALL_OLD")
    call(
        "put_item",
        TableName="t",
        Item={**_key("ATTEMPT#000002#0"), **_item(5)},
        ConditionExpression="attribute_not_exists(pk)",
    )
    call(
        "update_item",
        TableName="t",
        Key=_key("ATTEMPT#000003#2"),
        UpdateExpression="SET m.k = :v, #r.#q = #r.#q + :one ADD ss :s REMOVE z",
        ExpressionAttributeNames={"#r": "requests", "#q": "dynamodb.Query"},
        ExpressionAttributeValues={":v": {"S": "y"}, ":one": {"N": "1"}, ":s": {"SS": ["new"]}},
        ReturnValues="ALL_NEW",
    )
    call(
        "update_item",
        TableName="t",
        Key=_key("ATTEMPT#000004#0"),
        UpdateExpression="SET n = :n",
        ConditionExpression="t = :t",
        ExpressionAttributeValues={":n": {"N": "7"}, ":t": {"BOOL": False}},
        ReturnValues="UPDATED_OLD",
    )
    call("delete_item", TableName="t", Key=_key("ATTEMPT#000005#1"), ReturnValues="ALL_OLD")
    call(
        "transact_write_items",
        TransactItems=[
            {"Put": {"TableName": "t", "Item": {**_key("ATTEMPT#000006#9"), **_item(1)}}},
            {
                "ConditionCheck": {
                    "TableName": "t",
                    "Key": _key("ATTEMPT#000006#0"),
                    "ConditionExpression": "n = :x",
                    "ExpressionAttributeValues": {":x": {"N": "-1"}},
                }
            },
        ],
    )
    call(
        "transact_write_items",
        TransactItems=[
            {
                "Update": {
                    "TableName": "t",
                    "Key": _key("ATTEMPT#000007#0"),
                    "UpdateExpression": "SET s = :s",
                    "ExpressionAttributeValues": {":s": {"S": "tx"}},
                }
            },
            {"Delete": {"TableName": "t", "Key": _key("ATTEMPT#000007#1")}},
        ],
    )
    call(
        "batch_write_item",
        RequestItems={
            "t": [
                {"PutRequest": {"Item": {**_key("ROUND#000001"), **_item(3)}}},
                {"DeleteRequest": {"Key": _key("ATTEMPT#000008#2")}},
            ]
        },
    )
    for sk in ("ATTEMPT#000003#2", "ATTEMPT#000004#0", "ATTEMPT#000005#1", "ATTEMPT#000007#0", "ROUND#000001"):
        call("get_item", TableName="t", Key=_key(sk), ConsistentRead=True)
    call("get_item", TableName="t", Key=_key("ATTEMPT#000001#1"), ProjectionExpression="m.l, bs, requests")
    call("batch_get_item", RequestItems={"t": {"Keys": [_key(f"ATTEMPT#{r:06d}#0") for r in range(10)]}})
    call(
        "transact_get_items",
        TransactItems=[{"Get": {"TableName": "t", "Key": _key("ATTEMPT#000009#1")}}],
    )
    for extra in ({}, {"Limit": 4}, {"ScanIndexForward": False, "Limit": 5}):
        call(
            "query",
            TableName="t",
            KeyConditionExpression="pk = :p AND begins_with(sk, :a)",
            ExpressionAttributeValues={":p": {"S": "p"}, ":a": {"S": "ATTEMPT#00000"}},
            **extra,
        )
    call("scan", TableName="t", FilterExpression="t = :t", ExpressionAttributeValues={":t": {"BOOL": True}})
    call("execute_statement", Statement="SELECT * FROM t WHERE pk = 'p' AND sk = 'ATTEMPT#000002#2'")
    call("describe_table", TableName="t")
    out[-1][1]["Table"].pop("CreationDateTime")
    return out


def _frozen(table):
    return sum(type(v) is memory.Frozen for part in table.items.values() for v in dict.values(part))


@pytest.mark.parametrize("hot", [0, 3])
def test_items_held_as_bytes_answer_as_moto_objects(monkeypatch, hot):
    """The same requests, with every item kept as moto's objects and with all but `hot` stored as
    bytes before every request: the same answers; the bytes really were there."""
    import boto3
    from moto import mock_aws
    from moto.dynamodb.models import dynamodb_backends

    from smlt.runtime.records import create_run_table

    answers, frozen = [], []
    for keep in (10**9, hot):
        monkeypatch.setattr(memory, "HOT_ITEMS", keep)
        with mock_aws():
            ddb = boto3.client("dynamodb", region_name="us-east-1")
            create_run_table(ddb, "t")
            answers.append(_workload(ddb))
            table = dynamodb_backends["123456789012"]["us-east-1"].tables["t"]
            memory.freeze_cold()
            frozen.append(_frozen(table))
    assert answers[0] == answers[1]
    assert frozen[0] == 0 and frozen[1] >= 28 - hot
    assert any(op == "update_item" and "Attributes" in resp for op, resp in answers[1])


def test_a_frozen_item_thaws_to_the_same_moto_item():
    import copy

    from moto.dynamodb.models.dynamo_type import DynamoType, Item

    codec = memory._CODEC[0]
    for i in (0, 1, 4):
        item = Item(DynamoType({"S": "p"}), DynamoType({"S": f"s{i}"}), _item(i))
        spilled = memory.ITEMS.size
        frozen = codec.freeze(item)
        assert type(frozen) is memory.Frozen and len(frozen) < 600
        # its bytes are in the spill file; in memory, only where they are
        assert memory.ITEMS.size == spilled + len(frozen) and sys.getsizeof(frozen) < 64
        back = codec.thaw(frozen)
        assert back == item and back.to_json() == copy.deepcopy(item).to_json()
        assert type(back.attrs) is type(item.attrs)


ARENAS = """
import ctypes, os, sys, tempfile, threading
from smlt.local import memory
if sys.argv[1] == "capped":
    assert memory.limit_malloc_arenas()
barrier, held = threading.Barrier(12), []
def work():
    barrier.wait()  # all at once: glibc gives a contended thread an arena of its own
    held.append([bytearray(2000) for _ in range(3000)])
threads = [threading.Thread(target=work) for _ in range(12)]
[t.start() for t in threads]
[t.join() for t in threads]
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fclose(ctypes.c_void_p(fp))
print(open(path).read().count("<heap nr="))
"""


def test_the_engine_process_keeps_its_heap_in_few_malloc_arenas():
    """glibc's malloc_info lists one heap per arena: threads allocating at once spread over many,
    and over at most MALLOC_ARENAS once capped (the engine caps its process at start)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    counts = {}
    for mode in ("default", "capped"):
        out = subprocess.run([sys.executable, "-c", ARENAS, mode], env=env, capture_output=True, text=True, check=True)
        counts[mode] = int(out.stdout)
    assert counts["capped"] <= memory.MALLOC_ARENAS < counts["default"]


def test_thawing_adds_nothing_to_motos_instance_list(monkeypatch):
    """moto's BaseModel.__new__ keeps every instance for good (without the speed patches): a
    thawed item is the one moto made, so a read must not add one."""
    from moto.core.common_models import BaseModel
    from moto.dynamodb.models.dynamo_type import DynamoType, Item

    made = []

    def tracking_new(cls, *args, **kwargs):
        made.append(cls)
        return object.__new__(cls)

    monkeypatch.setattr(BaseModel, "__new__", staticmethod(tracking_new))
    item = Item(DynamoType({"S": "p"}), DynamoType({"S": "s"}), _item(2))
    assert made == [Item]
    back = memory._CODEC[0].thaw(memory._CODEC[0].freeze(item))
    assert back == item and made == [Item]

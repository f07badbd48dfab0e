"""smlt.local.speed: the per-request patches of moto give the same answers, and the pool's trace."""

import contextlib
import json
import socket
import socketserver
import threading
import uuid

import pytest

from smlt.local import patches, speed
from smlt.local.pool import WorkerPool
from smlt.runtime.records import create_run_table

# the root conftest installs the patches (without these when SMLT_LOCAL_SPEEDUPS=0)
pytestmark = pytest.mark.skipif(not speed.enabled(), reason="SMLT_LOCAL_SPEEDUPS=0: the speed patches are off")


def test_install_is_idempotent_and_keeps_answers():
    assert patches.install() == patches.install()
    assert {p.name for p in patches.PATCHES if p.apply} <= set(patches.install())
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
    from moto.stepfunctions.parser.asl.utils import json_path

    app = DomainDispatcherApplication(lambda backend: None)
    first = app.get_backend_for_host("dynamodb")
    assert first == "dynamodb" and app.get_backend_for_host("dynamodb") == first
    assert app.get_backend_for_host("s3.us-east-1.amazonaws.com") == "s3"
    assert app.get_backend_for_host(None) is None
    # one client per (region, service, stubber, port), shared by the interpreter's threads
    a = lambda_eval_utils.boto_client_for(region="us-east-1", service="lambda")
    assert lambda_eval_utils.boto_client_for(region="us-east-1", service="lambda") is a
    assert lambda_eval_utils.boto_client_for(region="eu-west-1", service="lambda") is not a
    # cached JSONPath parses evaluate as before, on any data
    assert json_path.extract_json("$.plan.workers", {"plan": {"workers": [0, 1]}}) == [0, 1]
    assert json_path.extract_json("$.plan.workers", {"plan": {"workers": [2]}}) == [2]
    assert json_path.extract_json("$.a[0]", {"a": [5, 6]}) == 5
    with pytest.raises(json_path.NoSuchJsonPathError):
        json_path.extract_json("$.plan.missing", {"plan": {}})


def test_nodelay_on_accepted_connections():
    seen = []

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            seen.append(self.request.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = socketserver.TCPServer(("127.0.0.1", 0), Handler)
    speed.nodelay(server)
    t = threading.Thread(target=server.handle_request, daemon=True)
    t.start()
    with socket.create_connection(server.server_address):
        pass
    t.join(5)
    server.server_close()
    assert seen and seen[0] != 0


HANDLER = """
def handler(event, context):
    import boto3
    try:
        boto3.client("s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                     aws_access_key_id="a", aws_secret_access_key="b",
                     config=__import__("botocore.config").config.Config(
                         retries={"max_attempts": 0}, connect_timeout=0.2)).list_buckets()
    except Exception:
        pass
    return {"ok": True}
"""


def test_pool_trace_times_the_handler_and_its_aws_calls(tmp_path):
    path = tmp_path / "handler.py"
    path.write_text(HANDLER)
    job = {
        "function": "fn",
        "arn": "arn:aws:lambda:us-east-1:123456789012:function:fn",
        "memory": 256,
        "module_file": str(path),
        "module_name": "handler",
        "attr": "handler",
        "payload": b"{}",
        "env": {},
        "request_id": str(uuid.uuid4()),
    }
    with WorkerPool(1) as pool:
        plain = pool.run(dict(job), timeout=30)
        traced = pool.run({**job, "trace": True}, timeout=30)
    assert plain.ok and plain.trace is None and json.loads(plain.payload) == {"ok": True}
    assert traced.ok and json.loads(traced.payload) == {"ok": True}
    assert traced.trace["handler_s"] > 0 and traced.queued_s >= 0
    assert traced.trace["api"]["s3.ListBuckets"][0] == 1


def test_transaction_rollback_restores_exactly_the_named_items():
    import boto3
    from botocore.exceptions import ClientError
    from moto import mock_aws

    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        create_run_table(ddb, "t")
        for sk in ("a", "b", "c"):
            ddb.put_item(TableName="t", Item={"pk": {"S": "p"}, "sk": {"S": sk}, "v": {"N": "1"}})

        def key(sk):
            return {"pk": {"S": "p"}, "sk": {"S": sk}}

        with pytest.raises(ClientError) as e:
            ddb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": "t", "Item": {**key("new"), "v": {"N": "9"}}}},
                    {
                        "Update": {
                            "TableName": "t",
                            "Key": key("a"),
                            "UpdateExpression": "SET v = :x",
                            "ExpressionAttributeValues": {":x": {"N": "7"}},
                        }
                    },
                    {"Delete": {"TableName": "t", "Key": key("b")}},
                    {
                        "ConditionCheck": {
                            "TableName": "t",
                            "Key": key("c"),
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
        assert e.value.response["Error"]["Code"] == "TransactionCanceledException"
        items = {i["sk"]["S"]: i["v"]["N"] for i in ddb.scan(TableName="t")["Items"]}
        assert items == {"a": "1", "b": "1", "c": "1"}
        ddb.transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": "t",
                        "Item": {**key("new"), "v": {"N": "9"}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "Update": {
                        "TableName": "t",
                        "Key": key("a"),
                        "UpdateExpression": "SET v = :x",
                        "ExpressionAttributeValues": {":x": {"N": "7"}},
                    }
                },
            ]
        )
        items = {i["sk"]["S"]: i["v"]["N"] for i in ddb.scan(TableName="t")["Items"]}
        assert items == {"a": "7", "b": "1", "c": "1", "new": "9"}


# --- item-sized patches: each answer equals moto's own, computed on the same data -------------


@contextlib.contextmanager
def moto_unpatched(*names):
    """moto's own attributes back in place of speed's (those named, or all) for the block."""
    saved = []
    for owner, name, old in speed._ORIGINALS:
        if names and name not in names:
            continue
        saved.append((owner, name, vars(owner).get(name)))
        if old is None:
            delattr(owner, name)
        else:
            setattr(owner, name, old)
    assert saved and all(vars(o).get(n) is not new for o, n, new in saved)
    try:
        yield
    finally:
        for owner, name, new in reversed(saved):
            setattr(owner, name, new)


def both(fn, *names):
    """fn() patched, then fn() with moto's own attributes named (all if none)."""
    patched = fn()
    with moto_unpatched(*names):
        unpatched = fn()
    return patched, unpatched


def _table(ddb, name, range_type="S"):
    keys = [{"AttributeName": "pk", "KeyType": "HASH"}]
    attrs = [{"AttributeName": "pk", "AttributeType": "S"}]
    if range_type:
        keys.append({"AttributeName": "sk", "KeyType": "RANGE"})
        attrs.append({"AttributeName": "sk", "AttributeType": range_type})
    ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", KeySchema=keys, AttributeDefinitions=attrs)


def _rich(i):
    """An item body with every attribute type, nesting, and empty containers."""
    return {
        "n": {"N": str(i)},
        "f": {"N": f"{i / 7:.5f}"},
        "s": {"S": "x" * (i % 5)},
        "e": {"S": ""},
        "b": {"B": bytes([i % 256]) * 3},
        "t": {"BOOL": i % 2 == 0},
        "z": {"NULL": True},
        "ss": {"SS": [f"a{i}", "b"]},
        "ns": {"NS": ["1", str(i + 2)]},
        "bs": {"BS": [b"\x00\x01", bytes([i % 256 + 0]) + b"q"]},
        "m": {
            "M": {
                "k": {"N": "1"},
                "em": {"M": {}},
                "el": {"L": []},
                "l": {"L": [{"S": "a"}, {"M": {"x": {"B": b"\xff"}}}, {"L": [{"NULL": True}]}]},
            }
        },
        "l": {"L": [{"N": str(j)} for j in range(i % 4)]},
    }


def test_dynamodb_serializer_and_conversion_match_moto():
    """Every AttributeValue shape, through GetItem/BatchGetItem/Query, and odd values straight
    through the serializer (they fall back to moto's walk)."""
    import boto3
    from moto import mock_aws
    from moto.core.serialize import JSONSerializer, XFormedAttributePicker
    from moto.core.utils import get_service_model
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.utilities import dynamo_to_dict as moto_d2d

    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        _table(ddb, "t")
        for i in range(6):
            ddb.put_item(TableName="t", Item={"pk": {"S": "p"}, "sk": {"S": f"s{i}"}, **_rich(i)})

        def calls():
            key = {"pk": {"S": "p"}, "sk": {"S": "s3"}}
            out = [
                ddb.get_item(TableName="t", Key=key),
                ddb.get_item(TableName="t", Key=key, ProjectionExpression="m.l, bs"),
                ddb.get_item(TableName="t", Key={"pk": {"S": "p"}, "sk": {"S": "none"}}),
                ddb.batch_get_item(
                    RequestItems={"t": {"Keys": [{"pk": {"S": "p"}, "sk": {"S": f"s{i}"}} for i in (0, 2, 5)]}}
                ),
                ddb.query(
                    TableName="t", KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "p"}}
                ),
                ddb.put_item(
                    TableName="t", Item={"pk": {"S": "p"}, "sk": {"S": "s1"}, **_rich(1)}, ReturnValues="ALL_OLD"
                ),
            ]
            for o in out:
                o.pop("ResponseMetadata")
            return out

        patched, unpatched = both(calls, "_serialize_type_structure", "dynamo_to_dict")
        assert patched == unpatched and patched[0]["Item"]["b"] == {"B": b"\x03\x03\x03"}

    om = get_service_model("dynamodb").operation_model("GetItem")

    def body(item):
        ser = JSONSerializer(operation_model=om, value_picker=XFormedAttributePicker())
        return ser.serialize({"Item": item})["body"]

    odd = [
        {"a": {"S": None}},
        {"a": {"s": "lower"}},
        {"a": {"S": "x", "N": "1"}},
        {"a": {}},
        {"a": {"N": 5}},
        {"a": {"M": {"k": None, "j": {"S": "ok"}}}},
        {"a": {"L": [None, {"S": "y"}]}},
        {"a": {"SS": ["a", 1]}},
        {"a": {"B": "aGk="}},
        {"a": {"BS": ["aGk=", b"hi"]}},
        {"a": {"BOOL": 1}},
        {"a": {"StringAttributeValue": "alias"}},
        {"a": None},
        {"a": {"L": [{"M": {"deep": {"NS": ["1.50"]}}}]}, "b": {"NULL": True}},
    ]
    for item in odd:
        patched, unpatched = both(lambda: body(item), "_serialize_type_structure")
        assert patched == unpatched, item

    from datetime import datetime

    def typed(x):  # equality that also tells bytes from str, list from tuple...
        if isinstance(x, dict):
            return (type(x), {k: typed(v) for k, v in x.items()})
        if isinstance(x, (list, tuple)):
            return (type(x), [typed(v) for v in x])
        return (type(x), x)

    from moto.dynamodb import responses as ddb_responses

    values = [
        DynamoType({"B": "aGk="}),
        DynamoType({"B": b"raw"}),
        DynamoType({"BS": ["aGk=", b"r"]}),
        DynamoType({"M": {"l": {"L": [{"N": "1"}, {"BOOL": False}]}}}),
        datetime(2024, 1, 2),
        {"Items": [{"a": DynamoType({"S": "s"})}], "Count": 1, "x": (1, 2), "d": 1.5},
        [None, b"b", "s", 3],
    ]
    for v in values:
        assert typed(ddb_responses.dynamo_to_dict(v)) == typed(moto_d2d(v))


def test_query_matches_moto():
    """Key conditions x Limit x direction x pagination x filter/projection, on string, number
    and no range keys, a second partition, and a 1 MB limit made small: same pages as moto."""
    import boto3
    from moto import mock_aws
    from moto.dynamodb.models import table as table_module

    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        _table(ddb, "s")
        _table(ddb, "n", "N")
        _table(ddb, "h", None)
        for pk in ("p", "q", "r"):
            for i in range(12):
                ddb.put_item(TableName="s", Item={"pk": {"S": pk}, "sk": {"S": f"{'AB'[i % 2]}#{i:02d}"}, **_rich(i)})
                ddb.put_item(
                    TableName="n", Item={"pk": {"S": pk}, "sk": {"N": str(i * 5 - 17) + ".5" * (i % 2)}, **_rich(i)}
                )
            ddb.put_item(TableName="h", Item={"pk": {"S": pk}, **_rich(3)})
        # an update in place (nested): still a bounded item
        ddb.update_item(
            TableName="s",
            Key={"pk": {"S": "p"}, "sk": {"S": "A#04"}},
            UpdateExpression="SET m.k = :v",
            ExpressionAttributeValues={":v": {"S": "y" * 900}},
        )

        conditions = {
            "s": [
                ("pk = :p", {}),
                ("pk = :p AND begins_with(sk, :a)", {":a": {"S": "B#"}}),
                ("pk = :p AND sk BETWEEN :a AND :b", {":a": {"S": "A#03"}, ":b": {"S": "B#09"}}),
                ("pk = :p AND sk BETWEEN :a AND :b", {":a": {"S": "B"}, ":b": {"S": "A"}}),
                ("pk = :p AND sk < :a", {":a": {"S": "A#06"}}),
                ("pk = :p AND sk >= :a", {":a": {"S": "B#05"}}),
                ("pk = :p AND sk = :a", {":a": {"S": "A#10"}}),
                ("pk = :p AND sk > :a", {":a": {"S": "~"}}),
                ("pk = :p AND sk <= :a", {":a": {"S": "A#00"}}),
            ],
            "n": [
                ("pk = :p", {}),
                ("pk = :p AND sk BETWEEN :a AND :b", {":a": {"N": "-8"}, ":b": {"N": "23.5"}}),
                ("pk = :p AND sk > :a", {":a": {"N": "3"}}),
                ("pk = :p AND sk = :a", {":a": {"N": "-2.00"}}),
            ],
            "h": [("pk = :p", {})],
        }
        extras = [
            {},
            {"Limit": 1},
            {"Limit": 3},
            {"Limit": 6},
            {"ScanIndexForward": False},
            {"ScanIndexForward": False, "Limit": 4},
            {"FilterExpression": "t = :t", "Limit": 5, "ExpressionAttributeValues": {":t": {"BOOL": True}}},
            {"ProjectionExpression": "sk, m.l, ns"},
            {"Select": "COUNT"},
        ]

        def pages(table, cond, values, extra, pk):
            extra = dict(extra)
            extra_values = extra.pop("ExpressionAttributeValues", {})
            kwargs = dict(
                TableName=table,
                KeyConditionExpression=cond,
                ConsistentRead=True,
                **extra,
                ExpressionAttributeValues={":p": {"S": pk}, **values, **extra_values},
            )
            out = []
            while True:
                resp = ddb.query(**kwargs)
                resp.pop("ResponseMetadata")
                out.append(resp)
                if "LastEvaluatedKey" not in resp or len(out) > 40:
                    return out
                kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

        def run_all():
            return [
                pages(t, c, v, e, pk)
                for t, conds in conditions.items()
                for c, v in conds
                for e in extras
                for pk in ("p", "zz")
            ]

        patched, unpatched = both(run_all, "query")
        assert patched == unpatched
        assert any(len(p) > 1 for p in patched) and any(p[0]["Count"] == 0 for p in patched)

        old_limit = table_module.RESULT_SIZE_LIMIT
        table_module.RESULT_SIZE_LIMIT = 3000  # a few items per page: the size check decides
        try:
            patched, unpatched = both(run_all, "query")
        finally:
            table_module.RESULT_SIZE_LIMIT = old_limit
        assert patched == unpatched and max(len(p) for p in patched) > 3


def _sk(kind, r, w=None):
    return {"S": f"{kind}#{r:06d}" + ("" if w is None else f"#{w:03d}")}


_RANGE_CONDITIONS = {
    "s": [
        ("pk = :p", {}),
        ("pk = :p AND begins_with(sk, :a)", {":a": {"S": "ATTEMPT#000004#"}}),
        ("pk = :p AND begins_with(sk, :a)", {":a": {"S": "ATTEMPT#"}}),
        ("pk = :p AND begins_with(sk, :a)", {":a": {"S": "ROUND#"}}),
        ("pk = :p AND begins_with(sk, :a)", {":a": {"S": "NONE#"}}),
        ("pk = :p AND begins_with(sk, :a)", {":a": {"S": "~"}}),
        ("pk = :p AND sk BETWEEN :a AND :b", {":a": _sk("ROUND", 5), ":b": {"S": "ROUND#~"}}),
        ("pk = :p AND sk BETWEEN :a AND :b", {":a": _sk("PLAN", 3), ":b": _sk("ATTEMPT", 3)}),
        ("pk = :p AND sk = :a", {":a": _sk("PLAN", 7)}),
        ("pk = :p AND sk = :a", {":a": _sk("PLAN", 70)}),
        ("pk = :p AND sk < :a", {":a": _sk("ATTEMPT", 2, 1)}),
        ("pk = :p AND sk <= :a", {":a": _sk("ATTEMPT", 2, 1)}),
        ("pk = :p AND sk > :a", {":a": _sk("PLAN", 11)}),
        ("pk = :p AND sk >= :a", {":a": _sk("PLAN", 11)}),
    ],
    "n": [
        ("pk = :p", {}),
        ("pk = :p AND sk BETWEEN :a AND :b", {":a": {"N": "-5"}, ":b": {"N": "13.0"}}),
        ("pk = :p AND sk < :a", {":a": {"N": "-2.00"}}),
        ("pk = :p AND sk = :a", {":a": {"N": "1.1"}}),
        ("pk = :p AND sk >= :a", {":a": {"N": "25.1"}}),
    ],
}
_RANGE_STARTS = {  # ExclusiveStartKeys' sort keys: an item's, between items, before and after all
    "s": [_sk("ATTEMPT", 4, 1), {"S": "ATTEMPT#000004#0015"}, _sk("ROUND", 6), {"S": "A"}, {"S": "~"}],
    "n": [{"N": "-5.2"}, {"N": "4.0"}, {"N": "100"}],
}
_RANGE_EXTRAS = [
    {},
    {"Limit": 1},
    {"Limit": 5},
    {"ScanIndexForward": False},
    {"ScanIndexForward": False, "Limit": 3},
    {"FilterExpression": "t = :t", "Limit": 4, "ExpressionAttributeValues": {":t": {"BOOL": True}}},
    {"Select": "COUNT", "Limit": 7},
]
_START_EXTRAS = [{}, {"Limit": 2}, {"ScanIndexForward": False, "Limit": 3}]  # with an ExclusiveStartKey


def _all_pages(ddb, table, cond, values, extra, start=None):
    """Every page of one Query, following LastEvaluatedKey."""
    extra = dict(extra)
    extra_values = extra.pop("ExpressionAttributeValues", {})
    kwargs = dict(
        TableName=table,
        KeyConditionExpression=cond,
        **extra,
        ExpressionAttributeValues={":p": {"S": "p"}, **values, **extra_values},
    )
    if start is not None:
        kwargs["ExclusiveStartKey"] = start
    out = []
    while True:
        resp = ddb.query(**kwargs)
        resp.pop("ResponseMetadata")
        out.append(resp)
        if "LastEvaluatedKey" not in resp or len(out) > 80:
            return out
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _range_queries(ddb):
    out = []
    for t, conds in _RANGE_CONDITIONS.items():
        for c, v in conds:
            out += [_all_pages(ddb, t, c, v, e) for e in _RANGE_EXTRAS]
            # the ExclusiveStartKey of this partition, and of another one (its paging is the same)
            for pk, extras in (("p", _START_EXTRAS), ("q", _START_EXTRAS[:1])):
                for start in _RANGE_STARTS[t]:
                    for e in extras:
                        out.append(_all_pages(ddb, t, c, v, e, {"pk": {"S": pk}, "sk": start}))
    return out


def _change_every_way(ddb):
    """Deletes, inserts in the middle, overwrites, numbers equal to a deleted key, a cancelled
    transaction (moto restores its snapshot of the table) and a committed one."""
    from botocore.exceptions import ClientError

    for r in (2, 5, 9):
        ddb.delete_item(TableName="s", Key={"pk": {"S": "p"}, "sk": _sk("ATTEMPT", r, 1)})
        ddb.put_item(TableName="s", Item={"pk": {"S": "p"}, "sk": _sk("ATTEMPT", r, 7), **_rich(r + 1)})
        ddb.put_item(TableName="s", Item={"pk": {"S": "p"}, "sk": _sk("PLAN", r), **_rich(r + 2)})
    ddb.delete_item(TableName="n", Key={"pk": {"S": "p"}, "sk": {"N": "1.1"}})
    ddb.put_item(TableName="n", Item={"pk": {"S": "p"}, "sk": {"N": "1.10"}, **_rich(2)})
    ddb.put_item(TableName="n", Item={"pk": {"S": "p"}, "sk": {"N": "-100"}, **_rich(3)})
    put = {"Put": {"TableName": "s", "Item": {"pk": {"S": "p"}, "sk": _sk("ATTEMPT", 3, 9), **_rich(1)}}}
    check = {"TableName": "s", "Key": {"pk": {"S": "p"}, "sk": _sk("ROUND", 3)}}
    with pytest.raises(ClientError):
        ddb.transact_write_items(
            TransactItems=[put, {"ConditionCheck": {**check, "ConditionExpression": "attribute_not_exists(pk)"}}]
        )
    ddb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": "s", "Item": {"pk": {"S": "p"}, "sk": _sk("ATTEMPT", 3, 8), **_rich(1)}}},
            {"Delete": {"TableName": "s", "Key": {"pk": {"S": "p"}, "sk": _sk("ATTEMPT", 3, 0)}}},
        ]
    )


def test_query_over_the_sorted_keys_matches_moto_as_the_partition_changes():
    """The partition's keys kept in order (sorted_keys): ledger-like keys, pages, both directions,
    filters, ExclusiveStartKeys (an item's, between items, of another partition), then every kind
    of change to the partition: same pages as moto, whose loop reads the whole partition."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        _table(ddb, "s")
        _table(ddb, "n", "N")
        for r in range(12):
            for kind, w in [("ATTEMPT", 0), ("ATTEMPT", 1), ("ATTEMPT", 2), ("PLAN", None), ("ROUND", None)]:
                ddb.put_item(TableName="s", Item={"pk": {"S": "p"}, "sk": _sk(kind, r, w), **_rich(r)})
            ddb.put_item(TableName="s", Item={"pk": {"S": "q"}, "sk": _sk("ROUND", r), **_rich(r)})
            ddb.put_item(TableName="n", Item={"pk": {"S": "p"}, "sk": {"N": f"{r * 3 - 11}.{r % 3}"}, **_rich(r)})

        first, unpatched = both(lambda: _range_queries(ddb), "query")
        assert first == unpatched
        assert any(len(p) > 1 for p in first) and any(p[0]["Count"] == 0 for p in first)
        _change_every_way(ddb)  # the partitions keep their order now: change them
        second, unpatched = both(lambda: _range_queries(ddb), "query")
        assert second == unpatched and second != first


def test_query_reads_only_its_key_range(monkeypatch):
    """A begins_with / BETWEEN Query of a few items in a 600-item partition hands moto's loop
    those items and the one after them, not the partition (DynamoDB reads a key range)."""
    import boto3
    from moto import mock_aws

    seen = []
    loop = speed._query_loop

    def counted(table, candidates, *args):
        seen.append(len(candidates))
        return loop(table, candidates, *args)

    monkeypatch.setattr(speed, "_query_loop", counted)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        create_run_table(ddb, "t")
        for r in range(200):
            for kind in ("ATTEMPT", "PLAN", "ROUND"):
                ddb.put_item(TableName="t", Item={"pk": {"S": "p"}, "sk": {"S": f"{kind}#{r:06d}"}})
        for cond, values in [
            ("begins_with(sk, :a)", {":a": {"S": "PLAN#00015"}}),
            ("sk BETWEEN :a AND :b", {":a": {"S": "PLAN#000190"}, ":b": {"S": "PLAN#~"}}),
        ]:
            seen.clear()
            resp = ddb.query(
                TableName="t",
                KeyConditionExpression="pk = :p AND " + cond,
                ExpressionAttributeValues={":p": {"S": "p"}, **values},
            )
            assert resp["Count"] == 10 and seen == [11]


def _listings(s3):
    """Every page of ListObjectsV2 for prefixes, StartAfters, page sizes and a delimiter."""
    out = []
    for bucket in ("plain", "versioned"):
        for prefix in (None, "", "run/a/", "run/a/round/00000", "run/b/", "run/", "zzz", "run/a/round/000005/u"):
            for after in (None, "", "run/a/round/000007/update/1", "run/c", "~"):
                for size in (1000, 7):
                    kw = {"Bucket": bucket, "MaxKeys": size}
                    kw |= {"Prefix": prefix} if prefix is not None else {}
                    kw |= {"StartAfter": after} if after is not None else {}
                    pages = []
                    while True:
                        r = s3.list_objects_v2(**kw)
                        pages.append(
                            (
                                [(o["Key"], o["Size"], o["ETag"]) for o in r.get("Contents", [])],
                                r["KeyCount"],
                                r["IsTruncated"],
                                r.get("StartAfter"),
                                [c["Prefix"] for c in r.get("CommonPrefixes", [])],
                            )
                        )
                        if not r["IsTruncated"] or len(pages) > 40:
                            break
                        kw["ContinuationToken"] = r["NextContinuationToken"]
                    out.append(pages)
        r = s3.list_objects_v2(Bucket=bucket, Prefix="run/", Delimiter="/round/")  # moto answers
        out.append([[o["Key"] for o in r.get("Contents", [])], [c["Prefix"] for c in r.get("CommonPrefixes", [])]])
    return out


def test_s3_listing_over_sorted_names_matches_moto_as_the_bucket_changes():
    """ListObjectsV2 over the bucket's sorted names (s3-list-range): prefixes, StartAfter, pages
    with continuation tokens, a delimiter, a versioned bucket with delete markers; then keys
    added, overwritten and deleted between listings: the same pages as moto's walk."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        for b in ("plain", "versioned"):
            s3.create_bucket(Bucket=b)
        s3.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
        for b in ("plain", "versioned"):
            for run in ("a", "b"):
                for r in range(10):
                    for w in range(3):
                        s3.put_object(Bucket=b, Key=f"run/{run}/round/{r:06d}/update/{w}", Body=b"u" * (r + w))
                    s3.put_object(Bucket=b, Key=f"run/{run}/round/{r:06d}/model", Body=b"m" * r)
            s3.put_object(Bucket=b, Key="other", Body=b"o")
        first, unpatched = both(lambda: _listings(s3), "list_objects_v2")
        assert first == unpatched
        assert any(len(pages) > 1 for pages in first[:-1])  # paged, with continuation tokens
        for b in ("plain", "versioned"):  # every kind of change, then list again
            s3.delete_object(Bucket=b, Key="run/a/round/000004/model")  # a delete marker when versioned
            s3.delete_objects(
                Bucket=b, Delete={"Objects": [{"Key": f"run/b/round/000002/update/{w}"} for w in range(3)]}
            )
            s3.put_object(Bucket=b, Key="run/a/round/000005/update/0", Body=b"overwritten")
            s3.put_object(Bucket=b, Key="run/a/round/000010/update/0", Body=b"new")
            s3.copy_object(Bucket=b, Key="run/c/copied", CopySource={"Bucket": b, "Key": "other"})
        second, unpatched = both(lambda: _listings(s3), "list_objects_v2")
        assert second == unpatched and second != first


def test_s3_listing_reads_only_its_key_range(monkeypatch):
    """A listing after StartAfter near the end of a 600-key run prefix reads those keys' versions
    only, not the bucket's 600 (S3 reads a key range)."""
    import boto3
    from moto import mock_aws
    from moto.s3.utils import _VersionedKeyStore

    reads = []
    getlist = _VersionedKeyStore.getlist

    def counted(self, key, default=None):
        reads.append(key)
        return getlist(self, key, default)

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bkt")
        for i in range(600):
            s3.put_object(Bucket="bkt", Key=f"run/a/{i:06d}", Body=b"")
        s3.put_object(Bucket="bkt", Key="run/b/000000", Body=b"")
        monkeypatch.setattr(_VersionedKeyStore, "getlist", counted)
        r = s3.list_objects_v2(Bucket="bkt", Prefix="run/a/", StartAfter="run/a/000594")
        assert [o["Key"] for o in r["Contents"]] == [f"run/a/{i:06d}" for i in range(595, 600)]
        assert len(reads) == 5


def test_query_size_limit_with_an_oversized_item_matches_moto():
    """Only nested updates grow an item past 405,000 bytes; then moto's size check (which counts
    the item in hand, matching or not) can end a page early, and the shortcut must be off."""
    import boto3
    from moto import mock_aws

    was_set = speed._OVERSIZED.is_set()
    try:
        with mock_aws():
            ddb = boto3.client("dynamodb", region_name="us-east-1")
            _table(ddb, "t")
            for sk, size in (("A#1", 300_000), ("B#1", 260_000), ("B#2", 10), ("C#1", 10)):
                ddb.put_item(
                    TableName="t", Item={"pk": {"S": "p"}, "sk": {"S": sk}, "m": {"M": {"x": {"S": "x" * size}}}}
                )
            assert speed._OVERSIZED.is_set() == was_set
            for attr in ("y", "z"):  # B#1: 780 KB
                ddb.update_item(
                    TableName="t",
                    Key={"pk": {"S": "p"}, "sk": {"S": "B#1"}},
                    UpdateExpression=f"SET m.{attr} = :v",
                    ExpressionAttributeValues={":v": {"S": "y" * 260_000}},
                )
            assert speed._OVERSIZED.is_set()

            def run():
                out = []
                for cond, vals in [
                    ("pk = :p AND begins_with(sk, :a)", {":a": {"S": "A#"}}),
                    ("pk = :p", {}),
                    ("pk = :p AND sk > :a", {":a": {"S": "A#1"}}),
                ]:
                    for forward in (True, False):
                        resp = ddb.query(
                            TableName="t",
                            KeyConditionExpression=cond,
                            ScanIndexForward=forward,
                            ExpressionAttributeValues={":p": {"S": "p"}, **vals},
                            ProjectionExpression="sk",
                        )
                        resp.pop("ResponseMetadata")
                        out.append(resp)
                return out

            patched, unpatched = both(run, "query")
            assert patched == unpatched
            # A#1 (300 KB) matched; B#1 (780 KB, not matching) ended the page all the same
            assert patched[0]["Count"] == 1 and "LastEvaluatedKey" in patched[0]
    finally:
        if not was_set:
            speed._OVERSIZED.clear()


def test_item_size_and_copy_match_moto():
    import copy

    from moto.dynamodb.models.dynamo_type import DynamoType, Item

    item_size, copy_items = speed._HELPERS["item_size"], speed._HELPERS["copy_items"]
    items = [
        Item(
            DynamoType({"S": "p"}),
            DynamoType({"S": f"s{i}"}),
            {"pk": {"S": "p"}, "sk": {"S": f"s{i}"}, **_rich(i), "u": {"S": "é€😀"}},
        )
        for i in range(8)
    ]
    odd = copy.deepcopy(items[1])
    odd.attrs["m"].value["raw"] = {"S": "not a DynamoType"}  # moto's size() wraps it: fall back
    for item in items + [odd]:
        assert item_size(item) == item.size()
    mine, theirs = copy_items(items), copy.deepcopy(items)
    for a, b, src in zip(mine, theirs, items):
        assert type(a) is type(b) and type(a.attrs) is type(b.attrs)
        assert a.to_json() == b.to_json() == src.to_json()
        assert (a.hash_key, a.range_key) == (b.hash_key, b.range_key)
        a.attrs["m"].value["l"].value.append(DynamoType({"S": "new"}))  # a copy, not the original
        assert src.to_json() == b.to_json()


def test_s3_ranged_get_and_large_put_match_moto(monkeypatch):
    """Every kind of Range header on an empty, a small and a rolled-over (on-disk) object, plus
    partNumber and conditional GETs, HEAD; and a value past the buffer threshold reads back the
    same."""
    import os

    import boto3
    from botocore.exceptions import ClientError
    from moto import mock_aws
    from moto.s3.models import FakeKey

    from smlt.local.memory import SpilledBody

    monkeypatch.setenv("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(64 * 1024))
    bodies = {"empty": b"", "small": bytes(range(50)), "big": os.urandom(200 * 1024 + 7)}
    ranges = [
        "bytes=0-9",
        "bytes=10-",
        "bytes=-10",
        "bytes=-0",
        "bytes=0-0",
        "bytes=49-49",
        "bytes=5-2",
        "bytes=40-1000",
        "bytes=-1000",
        "bytes=50-",
        "bytes=100-200",
        "bytes=0-1,5-6",
        "bytes=abc",
        "bytes=",
        "bytes=-",
        "bytes=3-x",
        "bytes=0-",
        "bytes=70000-140000",
        "bytes=-70000",
        "bytes=204806-",
        "bytes=204807-",
    ]

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bkt")

        def put_all():
            for name, body in bodies.items():
                s3.put_object(Bucket="bkt", Key=name, Body=body)
            return {name: s3.head_object(Bucket="bkt", Key=name)["ETag"] for name in bodies}

        etags, moto_etags = both(put_all)  # the patched PUT (one write to the rolled file) too
        assert etags == moto_etags

        def get(**kw):
            try:
                r = s3.get_object(Bucket="bkt", **kw)
            except ClientError as e:
                return ("error", e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
            h = r["ResponseMetadata"]["HTTPHeaders"]
            return (
                r["ResponseMetadata"]["HTTPStatusCode"],
                r.get("ContentRange"),
                r["ContentLength"],
                h.get("content-length"),
                r["Body"].read(),
                r["ETag"],
                r.get("AcceptRanges"),
            )

        def head(**kw):
            try:
                r = s3.head_object(Bucket="bkt", **kw)
            except ClientError as e:
                return ("error", e.response["ResponseMetadata"]["HTTPStatusCode"])
            return (r["ResponseMetadata"]["HTTPStatusCode"], r.get("ContentRange"), r["ContentLength"])

        def run():
            out = []
            for name in bodies:
                out.append(get(Key=name))
                for rng in ranges:
                    out.append(get(Key=name, Range=rng))
                    out.append(head(Key=name, Range=rng))
                out.append(get(Key=name, PartNumber=1))
                out.append(get(Key=name, PartNumber=1, Range="bytes=0-3"))
                out.append(get(Key=name, IfNoneMatch=etags[name], Range="bytes=0-3"))
                out.append(get(Key=name, IfMatch='"nope"', Range="bytes=0-3"))
            out.append(get(Key="missing", Range="bytes=0-3"))
            return out

        patched, unpatched = both(run)
        assert patched == unpatched
        small = [o for o in patched if isinstance(o[0], int) and o[0] == 206]
        assert small and ("error", "InvalidRange", 416) in patched
        assert get(Key="big", Range="bytes=70000-140000")[4] == bodies["big"][70000:140001]
        key = FakeKey("k", bodies["big"], account_id="123456789012", region_name="us-east-1", max_buffer_size=1024)
        # the body is in the engine's spill file (memory patch spilled-s3-bodies), whatever its size
        assert isinstance(key._value_buffer, SpilledBody) and key.value == bodies["big"]
        key.value = b"short"
        assert key.value == b"short" and key.size == 5


def test_moto_keeps_no_dynamodb_object_nor_finished_thread_for_good():
    """A long local run's memory: moto's lists of every model object it made (its dashboard) and
    of every thread its interpreter started kept each transaction's rollback snapshot, each copied
    query result and each finished thread, growing every round. Only S3 keys are still listed."""
    import boto3
    from moto import mock_aws
    from moto.dynamodb.models.dynamo_type import Item
    from moto.dynamodb.models.table import Table
    from moto.s3.models import FakeKey
    from moto.stepfunctions.parser import utils

    with mock_aws():
        ddb, s3 = boto3.client("dynamodb", region_name="us-east-1"), boto3.client("s3", region_name="us-east-1")
        create_run_table(ddb, "runs")
        tables, items, fake_keys = (len(c.instances_tracked) for c in (Table, Item, FakeKey))
        for i in range(5):
            item = {"pk": {"S": "RUN#a"}, "sk": {"S": f"WORKER#{i}"}}
            ddb.transact_write_items(TransactItems=[{"Put": {"TableName": "runs", "Item": item}}])
            ddb.query(
                TableName="runs", KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "RUN#a"}}
            )
        assert (len(Table.instances_tracked), len(Item.instances_tracked)) == (tables, items)
        s3.create_bucket(Bucket="smlt-tracked")
        s3.put_object(Bucket="smlt-tracked", Key="k", Body=b"x")
        assert len(FakeKey.instances_tracked) == fake_keys + 1  # S3's reset closes the keys' files

    done, running = threading.Thread(target=lambda: None), threading.Thread(target=threading.Event().wait, args=(5,))
    done.start()
    done.join()
    running.start()
    utils.TMP_THREADS.append(done)
    utils.TMP_THREADS.append(running)  # the finished thread goes as a new one comes
    assert done not in utils.TMP_THREADS and running in utils.TMP_THREADS

"""smlt.local.speed: the per-request patches of moto give the same answers, and the pool's trace."""

import json
import socket
import socketserver
import threading
import uuid

import pytest

from smlt.local import speed
from smlt.local.pool import WorkerPool


def test_install_is_idempotent_and_keeps_answers():
    speed.install()
    speed.install()
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
    job = {"function": "fn", "arn": "arn:aws:lambda:us-east-1:123456789012:function:fn", "memory": 256,
           "module_file": str(path), "module_name": "handler", "attr": "handler", "payload": b"{}",
           "env": {}, "request_id": str(uuid.uuid4())}
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

    speed.install()
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                    {"AttributeName": "sk", "KeyType": "RANGE"}],
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                               {"AttributeName": "sk", "AttributeType": "S"}])
        for sk in ("a", "b", "c"):
            ddb.put_item(TableName="t", Item={"pk": {"S": "p"}, "sk": {"S": sk}, "v": {"N": "1"}})

        def key(sk):
            return {"pk": {"S": "p"}, "sk": {"S": sk}}

        with pytest.raises(ClientError) as e:
            ddb.transact_write_items(TransactItems=[
                {"Put": {"TableName": "t", "Item": {**key("new"), "v": {"N": "9"}}}},
                {"Update": {"TableName": "t", "Key": key("a"), "UpdateExpression": "SET v = :x",
                            "ExpressionAttributeValues": {":x": {"N": "7"}}}},
                {"Delete": {"TableName": "t", "Key": key("b")}},
                {"ConditionCheck": {"TableName": "t", "Key": key("c"),
                                    "ConditionExpression": "attribute_not_exists(pk)"}}])
        assert e.value.response["Error"]["Code"] == "TransactionCanceledException"
        items = {i["sk"]["S"]: i["v"]["N"] for i in ddb.scan(TableName="t")["Items"]}
        assert items == {"a": "1", "b": "1", "c": "1"}
        ddb.transact_write_items(TransactItems=[
            {"Put": {"TableName": "t", "Item": {**key("new"), "v": {"N": "9"}},
                     "ConditionExpression": "attribute_not_exists(pk)"}},
            {"Update": {"TableName": "t", "Key": key("a"), "UpdateExpression": "SET v = :x",
                        "ExpressionAttributeValues": {":x": {"N": "7"}}}}])
        items = {i["sk"]["S"]: i["v"]["N"] for i in ddb.scan(TableName="t")["Items"]}
        assert items == {"a": "7", "b": "1", "c": "1", "new": "9"}

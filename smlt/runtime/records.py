"""DynamoDB data access for a run: one partition per run (see smlt/runtime/keys.py).

Every write that a retried step could repeat is conditional (`attribute_not_exists`), so the
first writer wins and a duplicate gets the stored item back instead of overwriting it. A write
refused because another transaction held the item (TransactionConflict) is retried with jitter
(smlt/runtime/retry.py): it says nothing about whether the item exists.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, TypeVar, overload

from boto3.dynamodb.types import TypeDeserializer
from botocore.exceptions import ClientError
from dynamodb_json import json_util

from smlt.runtime import clients, keys
from smlt.runtime.errors import UserCodeError
from smlt.runtime.items import ErrorItem, Item, MetaItem, PlanItem, RoundItem, StopItem, WorkerItem
from smlt.runtime.retry import DYNAMODB_CONFLICTS, TRANSACTION_CONFLICT_REASONS, Conflict, on_conflict


def dynamodb_client() -> Any:
    return clients.client("dynamodb")


def to_item(obj: dict[str, Any]) -> dict:
    return json.loads(json_util.dumps(obj))


_DESERIALIZER = TypeDeserializer()


def _plain(v: Any) -> Any:
    """DynamoDB numbers arrive as Decimal: integral ones become int, the rest float."""
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() and "E" not in str(v) and "." not in str(v) else float(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | set):
        return [_plain(x) for x in v]
    return v


def from_item(item: dict) -> dict[str, Any]:
    # boto3's deserializer, not dynamodb_json's loads: that one leaves numbers written in
    # exponent form ({"N": "7.3E-7"}, how tiny timings are stored) as raw {"N": ...} dicts.
    return {k: _plain(_DESERIALIZER.deserialize(v)) for k, v in item.items()}


ItemT = TypeVar("ItemT", bound=Item)


class Fetched(dict[str, dict[str, Any] | None]):
    """What `get_many` read: {sk: the stored attributes, or None}; `item` reads one as its model."""

    def item(self, sk: str, model: type[ItemT]) -> ItemT | None:
        raw = self[sk]
        return None if raw is None else model.model_validate(raw)


def create_run_table(client: Any, name: str) -> None:
    """Create an empty run table with the stack's key schema (`infra/stacks/table.py`: pk and sk
    strings, on demand), for tests and benchmarks on moto."""
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
    )


class RunTable:
    def __init__(self, table: str, run_id: str, client=None):
        self.table = table
        self.run_id = run_id
        self.pk = keys.pk(run_id)
        self._client = client

    @property
    def client(self):
        return self._client or dynamodb_client()

    def get(self, sk: str, model: type[ItemT]) -> ItemT | None:
        raw = self._get(sk)
        return None if raw is None else model.model_validate(raw)

    def _get(self, sk: str) -> dict[str, Any] | None:
        resp = self.client.get_item(TableName=self.table, Key=to_item({"pk": self.pk, "sk": sk}), ConsistentRead=True)
        return from_item(resp["Item"]) if "Item" in resp else None

    def get_many(self, *sks: str) -> Fetched:
        """Several items of the run in one BatchGetItem (strongly consistent), in the order asked.
        A round's steps read 3-4 items before they start; one request instead of one each."""
        want = list(dict.fromkeys(sks))
        found = Fetched(dict.fromkeys(want))
        for i in range(0, len(want), 100):  # BatchGetItem takes at most 100 keys
            self._get_batch(want[i : i + 100], found)
        return found

    def _get_batch(self, sks: list[str], found: dict[str, dict[str, Any] | None]) -> None:
        request = {self.table: {"Keys": [to_item({"pk": self.pk, "sk": sk}) for sk in sks], "ConsistentRead": True}}
        attempt = 0
        while request:
            if attempt == 10:
                raise RuntimeError(f"DynamoDB left keys of {self.table} unprocessed 10 times (throttled)")
            if attempt:
                time.sleep(0.05 * 2**attempt)
            attempt += 1
            resp = self.client.batch_get_item(RequestItems=request)
            for raw in resp.get("Responses", {}).get(self.table, []):
                item = from_item(raw)
                found[item["sk"]] = item
            request = resp.get("UnprocessedKeys") or {}  # throttled keys: ask again, backing off

    @overload
    def put_once(self, sk: str, item: ItemT) -> tuple[bool, ItemT]: ...
    @overload
    def put_once(self, sk: str, item: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]: ...
    def put_once(self, sk: str, item: Item | Mapping[str, Any]) -> tuple[bool, Item | dict[str, Any]]:
        """Write the item unless it exists. Returns (written, the item now stored), as a model when
        given one (as raw attributes for tools and tests that write raw items)."""
        raw = {"pk": self.pk, "sk": sk, **(item.attrs() if isinstance(item, Item) else item)}
        if on_conflict(lambda: self._put_if_absent(raw), DYNAMODB_CONFLICTS):
            return True, item if isinstance(item, Item) else raw
        stored = self._get(sk) or raw
        return False, type(item).model_validate(stored) if isinstance(item, Item) else stored

    def put_unless_sealed(self, sk: str, item: Item, seal_sk: str) -> str:
        """Write the item once, atomically with a check that `seal_sk` does not exist yet.

        Returns "written", "duplicate" (the item existed) or "sealed" (too late: the round is
        closed). The transaction makes lateness a fact of the keys, not of timing.
        """
        return on_conflict(lambda: self._put_unless_sealed(sk, item, seal_sk), DYNAMODB_CONFLICTS)

    def _put_if_absent(self, raw: dict[str, Any]) -> bool:
        try:
            self.client.put_item(
                TableName=self.table, Item=to_item(raw), ConditionExpression="attribute_not_exists(pk)"
            )
            return True
        except ClientError as e:
            if e.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False

    def _put_unless_sealed(self, sk: str, item: Item, seal_sk: str) -> str:
        key = to_item({"pk": self.pk, "sk": seal_sk})
        try:
            self.client.transact_write_items(
                TransactItems=[
                    {
                        "ConditionCheck": {
                            "TableName": self.table,
                            "Key": key,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                    {
                        "Put": {
                            "TableName": self.table,
                            "Item": to_item({"pk": self.pk, "sk": sk, **item.attrs()}),
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
            return "written"
        except ClientError as e:
            if e.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            reasons = {r.get("Code") for r in e.response.get("CancellationReasons", [])}
            if reasons & TRANSACTION_CONFLICT_REASONS:
                raise Conflict(e) from None  # another write held the seal or the record: try again
            return self._why_refused(sk, seal_sk, e)

    def _why_refused(self, sk: str, seal_sk: str, e: ClientError) -> str:
        """Why a cancelled record transaction was refused, from the keys themselves: "duplicate"
        only when this worker's record is stored (it counts: it landed before any seal), "sealed"
        only when the seal is. Neither (reasons missing, as moto may answer): try again."""
        found = self.get_many(sk, seal_sk)
        if found[sk] is not None:
            return "duplicate"
        if found[seal_sk] is not None:
            return "sealed"
        raise Conflict(e)

    def update(
        self,
        sk: str,
        model: type[Item],
        *,
        only_if: str | None = None,
        values: dict[str, Any] | None = None,
        **changes: Any,
    ) -> bool:
        """Set fields of `model` on an existing item (validated and stored as the model stores
        them); with `only_if` (a condition), False when it fails."""
        attrs = _stored_fields(model, changes)
        names = {f"#a{i}": k for i, k in enumerate(attrs)}
        vals = {f":v{i}": v for i, v in enumerate(attrs.values())}
        vals.update(values or {})
        cond = "attribute_exists(pk)" + (f" AND ({only_if})" if only_if else "")
        request = dict(
            TableName=self.table,
            Key=to_item({"pk": self.pk, "sk": sk}),
            UpdateExpression="SET " + ", ".join(f"#a{i} = :v{i}" for i in range(len(attrs))),
            ConditionExpression=cond,
            ExpressionAttributeNames={**names, **{f"#{n}": n for n in _names_in(only_if)}},
            ExpressionAttributeValues=to_item(vals),
        )
        return on_conflict(lambda: self._update(request), DYNAMODB_CONFLICTS)

    def _update(self, request: dict[str, Any]) -> bool:
        try:
            self.client.update_item(**request)
            return True
        except ClientError as e:
            if e.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False

    def query(self, prefix: str) -> list[dict[str, Any]]:
        """The raw items whose sk starts with `prefix` (all of the run's with "")."""
        if not prefix:
            return self._query("pk = :pk", {":pk": self.pk})
        return self._query("pk = :pk AND begins_with(sk, :p)", {":pk": self.pk, ":p": prefix})

    def _query(self, condition: str, values: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs = dict(
            TableName=self.table,
            ConsistentRead=True,
            KeyConditionExpression=condition,
            ExpressionAttributeValues=to_item(values),
        )
        while True:
            resp = self.client.query(**kwargs)
            items.extend(from_item(i) for i in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return items
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    # Named accessors keep the key layout in one place. Lists come in key order (= round order).
    def meta(self) -> MetaItem | None:
        return self.get(keys.META, MetaItem)

    def plan(self, rnd: int) -> PlanItem | None:
        return self.get(keys.plan_sk(rnd), PlanItem)

    def workers(self, rnd: int) -> list[WorkerItem]:
        return [WorkerItem.model_validate(i) for i in self.query(keys.worker_prefix(rnd))]

    def errors(self, rnd: int) -> dict[int, ErrorItem]:
        """The workers' non-transient errors of a round, by worker."""
        return {int(i["sk"].rsplit("#", 1)[1]): ErrorItem.model_validate(i) for i in self.query(f"ERROR#{rnd:06d}#")}

    def rounds(self, after: int | None = None) -> list[RoundItem]:
        """ROUND items, or only those after round `after` (a key range, not a filter)."""
        if after is None:
            raw = self.query("ROUND#")
        else:
            raw = self._query(
                "pk = :pk AND sk BETWEEN :a AND :b", {":pk": self.pk, ":a": keys.round_sk(after + 1), ":b": "ROUND#~"}
            )
        return [RoundItem.model_validate(i) for i in raw]

    def request_stop(self, reason: str, by: str = "user") -> StopItem:
        """Ask the run to stop: its next Plan stops it (after an evaluation of the newest model)
        and Finalize publishes the model. The first request stands; returns the stored one."""
        return self.put_once(keys.STOP, StopItem(requested_at=time.time(), reason=reason, by=by))[1]

    def plans(self) -> list[PlanItem]:
        return [PlanItem.model_validate(i) for i in self.query("PLAN#")]


def _stored_fields(model: type[Item], changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` validated as fields of `model` and serialized as the model stores them."""
    unknown = set(changes) - set(model.model_fields)
    if unknown:
        raise TypeError(f"{model.__name__} has no field {', '.join(sorted(unknown))}")
    item = model.model_construct()
    for name, value in changes.items():
        model.__pydantic_validator__.validate_assignment(item, name, value)
    return item.model_dump(include=set(changes))


def _names_in(expr: str | None) -> list[str]:
    """Attribute names written as #name in a condition expression."""
    return re.findall(r"#([A-Za-z_]\w*)", expr or "")


def raise_late_user_error(table: RunTable) -> None:
    """The user's code's error a worker recorded after its round closed (its watchdog stopped a
    hung call once the Map had stopped waiting for it: `FATAL`), raised as the run's (one read)."""
    fatal = table.get(keys.FATAL, ErrorItem)
    if fatal is not None and fatal.error == "UserCodeError":
        raise UserCodeError(f"worker {fatal.worker}, round {fatal.round}: {fatal.message}")

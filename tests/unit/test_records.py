"""DynamoDB item (de)serialisation: what is written is what is read back."""

from smlt.runtime.records import from_item, to_item


def test_numbers_in_exponent_form_read_back_as_numbers():
    # A handler's eval time of a few hundred nanoseconds is stored as {"N": "7.31E-7"}; the
    # planner then validated it as a float and failed (dynamodb_json's loads left it raw).
    item = {"eval_s": 7.31e-07, "nested": [{"x": 1e-9}], "big": 1e20, "rows": 3, "lr": 2.0, "name": "a", "none": None}
    assert to_item(item)["eval_s"] == {"N": "7.31E-7"}
    back = from_item(to_item(item))
    assert back == item
    assert type(back["rows"]) is int and type(back["lr"]) is float and type(back["eval_s"]) is float

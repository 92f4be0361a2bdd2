"""JSON schemas of Java classes: what Jackson writes for them passes.

Pulsar's Java client derives a JSON schema's definition from the class with
Avro's ReflectData, and writes the values with Jackson; the two disagree on a
few Java types, and the consumer (Jackson again) reads what Jackson wrote:

- BigDecimal and BigInteger are "stringable": ``string`` with a ``java-class``
  in the definition, a JSON number in the payload.
- A map whose keys are not strings is an array of key/value records
  (``org.apache.avro.reflect.Pair...``, the array's ``java-class`` the map's
  class) in the definition, a JSON object in the payload.
- A ``char`` is an ``int`` with ``java-class`` java.lang.Character in the
  definition, a one-character string in the payload.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.filters.schemas import Mismatch, validator
from sluice.protocols.filtering import Schema

# What ReflectData.AllowNull makes of
#   class Price { BigDecimal amount; BigInteger units; URI link;
#                 Map<Integer, String> names; Map<Long, Price> nested; char grade; }
BIG_DECIMAL = {"type": "string", "java-class": "java.math.BigDecimal"}
BIG_INTEGER = {"type": "string", "java-class": "java.math.BigInteger"}
PRICE: dict[str, Any] = {
    "type": "record",
    "name": "Price",
    "namespace": "com.example",
    "fields": [
        {"name": "amount", "type": ["null", BIG_DECIMAL],
         "default": None},
        {"name": "units", "type": ["null", BIG_INTEGER],
         "default": None},
        {"name": "link", "type": ["null", {"type": "string", "java-class": "java.net.URI"}],
         "default": None},
        {"name": "names", "type": ["null", {
            "type": "array", "java-class": "java.util.Map",
            "items": {"type": "record", "name": "PairIntegerString",
                      "namespace": "org.apache.avro.reflect",
                      "fields": [{"name": "key", "type": "int"},
                                 {"name": "value", "type": ["null", "string"]}]},
        }], "default": None},
        {"name": "grade", "type": {"type": "int", "java-class": "java.lang.Character"}},
    ],
}  # fmt: skip

CHECK = validator(Schema("JSON", json.dumps(PRICE).encode()))


def check(doc: dict[str, Any]) -> Mismatch | None:
    return CHECK(json.dumps(doc).encode(), None)


def test_what_jackson_writes_for_a_java_class_passes() -> None:
    assert check({"amount": 12.50, "units": 10**30, "link": "https://example.com",
                  "names": {"1": "one", "2": None}, "grade": "A"}) is None  # fmt: skip
    # As text too, and null where the definition allows it.
    assert check({"amount": "12.50", "units": None, "names": None, "grade": "B"}) is None
    # What ReflectData's own JSON form would be: the pairs as an array.
    assert check({"names": [{"key": 1, "value": "one"}], "grade": 65}) is None


def test_what_does_not_fit_the_java_class_is_still_refused() -> None:
    found = check({"amount": True, "grade": "A"})
    assert found is not None and found.reason == "wrong_type" and "'amount'" in found.message
    found = check({"names": {"1": 5}, "grade": "A"})
    assert found is not None and found.reason == "wrong_type" and "'names[1]'" in found.message
    found = check({"grade": "AB"})  # a char is one character
    assert found is not None and found.reason == "wrong_type" and "'grade'" in found.message
    found = check({"link": 5, "grade": "A"})  # a URI is text
    assert found is not None and found.reason == "wrong_type" and "'link'" in found.message
    # A map's values are checked; a record's pairs are not a map unless the
    # array says it stands for one.
    plain = {"type": "record", "name": "R", "fields": [{"name": "pairs", "type": {
        "type": "array", "items": PRICE["fields"][3]["type"][1]["items"]}}]}  # fmt: skip
    found = validator(Schema("JSON", json.dumps(plain).encode()))(b'{"pairs": {"1": "a"}}', None)
    assert found is not None and found.reason == "wrong_type"

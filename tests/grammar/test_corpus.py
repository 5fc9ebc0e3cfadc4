"""A corpus of JSON schemas as clients send them, through the server: each is accepted, and a
valid instance of it is in the grammar the engine receives; or it is refused with a 400 naming
the parameter and what was refused. Never a 500.

Each keyword, nesting, ``$ref`` cycles, unions, formats, Pydantic models (their own
``model_json_schema()`` and ``model_dump``) and Zod-shaped schemas (zod-to-json-schema's
draft-07 output, Zod 4's 2020-12 output). The instances are checked with ``jsonschema`` first,
and with an llguidance matcher over the default model's vocabulary in the grammar Podium made;
a sample is generated on the real model and validated.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional, Union

import jsonschema
import pytest
from pydantic import BaseModel, Field
from starlette.testclient import TestClient

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.grammar.conftest import generate

PARAM = "response_format.json_schema.schema"


@dataclass
class Case:
    """``schema``: accepted under strict, ``instances`` in its grammar; or refused: under
    strict only (``unenforced``: left out with a warning otherwise) or always (``invalid``),
    the message naming ``says``. ``prompt``: generated on the real model too."""
    name: str
    schema: Any
    instances: list[Any] = field(default_factory=list)
    unenforced: str | None = None
    invalid: str | None = None
    prompt: str | None = None
    param: str = PARAM
    indents: tuple[int | None, ...] = (None, 2)


CORPUS: list[Case] = []


def ok(name, schema, *instances, prompt=None, indents=(None, 2)):
    CORPUS.append(Case(name, schema, list(instances), prompt=prompt, indents=indents))


def unenforced(name, schema, keyword):
    CORPUS.append(Case(name, schema, unenforced=keyword))


def invalid(name, schema, says, param=PARAM):
    CORPUS.append(Case(name, schema, invalid=says, param=param))


def obj(properties: dict, required=None, **more) -> dict:
    """An object schema as strict clients write it: every property required, no others."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False, **more}


# -- each keyword --------------------------------------------------------------------------

ok("type string", {"type": "string"}, "", "a\"b\\c\n\u00e9\U0001f600")
ok("type integer", {"type": "integer"}, 0, -17, 12345678901234)
ok("type number", {"type": "number"}, 0, -1.5, 2e-3, 1e10)
ok("type boolean", {"type": "boolean"}, True, False)
ok("type null", {"type": "null"}, None)
ok("type object", {"type": "object"}, {}, {"a": [1, {"b": None}]})
ok("type array", {"type": "array"}, [], [1, "a", None, {"x": []}])
ok("type list", {"type": ["string", "integer", "null"]}, "a", 3, None)
ok("empty schema", {}, 1, "a", None, [{}], {"k": True})
ok("enum strings", {"enum": ["red", "green", "blue"]}, "green",
   prompt="What color is grass? Answer with a JSON string.")
ok("enum mixed", {"enum": [1, "1", None, True, [1], {"a": 1}]}, 1, "1", None, [1], {"a": 1})
ok("enum quotes", {"enum": ['say "hi"', "back\\slash", "new\nline"]}, 'say "hi"',
   "new\nline")
ok("enum unicode", {"enum": ["café", "日本", "😀"]}, "日本")
ok("enum 300", {"enum": [f"item_{i:03d}" for i in range(300)]}, "item_299")
ok("const string", {"const": "fixed"}, "fixed")
ok("const object", {"const": {"a": [1, 2], "b": None}}, {"a": [1, 2], "b": None})
ok("const null", {"const": None}, None)
ok("multipleOf int", {"type": "integer", "multipleOf": 5}, 0, 25, -10)
ok("multipleOf decimal", {"type": "number", "multipleOf": 0.01}, 1.25, 3)
ok("minimum int", {"type": "integer", "minimum": 3}, 3, 99)
ok("maximum int", {"type": "integer", "maximum": -3}, -3, -100)
ok("int range", {"type": "integer", "minimum": 10, "maximum": 12}, 10, 11, 12)
ok("exclusive int", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, 1, 2)
ok("minimum number", {"type": "number", "minimum": -1.5}, -1.5, 0, 7.25)
ok("maximum number", {"type": "number", "maximum": 0.001}, 0.001, -3)
ok("exclusive number", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
   0.5, 0.999)
ok("number range decimal", {"type": "number", "minimum": 0.25, "maximum": 0.75}, 0.5)
ok("minLength", {"type": "string", "minLength": 3}, "abc", "abcdef")
ok("maxLength", {"type": "string", "maxLength": 3}, "", "abc")
ok("length range", {"type": "string", "minLength": 2, "maxLength": 2}, "ab", "\u00e9\u00e9")
ok("maxLength 5000", {"type": "string", "maxLength": 5000}, "x" * 100)
ok("pattern", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"}, "AB-1234",
   prompt="Invent a product code. Answer with a JSON string.")
ok("pattern unanchored", {"type": "string", "pattern": "[0-9]"}, "a1b", "9")
ok("pattern digits", {"type": "string", "pattern": "^\\d+$"}, "0123")
ok("pattern alternation", {"type": "string", "pattern": "^(cat|dog)s?$"}, "cats", "dog")
ok("pattern with escapes", {"type": "string", "pattern": '^"[^"\\\\]*"$'}, '"quoted"')
ok("pattern a{1,3000}", {"type": "string", "pattern": "^a{1,3000}$"}, "a" * 3000)
ok("pattern and length", {"type": "string", "pattern": "^[a-z]+$", "minLength": 3,
                          "maxLength": 5}, "abc", "abcde")
ok("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 2])
ok("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 2}, [], [1, 2])
ok("minItems no items", {"type": "array", "minItems": 1}, [None], ["a", 1])
ok("items range", {"type": "array", "items": {"type": "string"}, "minItems": 1,
                   "maxItems": 3}, ["a"], ["a", "b", "c"])
ok("minItems 1000", {"type": "array", "items": {"type": "integer"}, "minItems": 1000},
   [0] * 1000)
ok("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
   [1], [1, "a"], [1, "a", None])
ok("prefixItems closed", {"type": "array", "prefixItems": [{"type": "number"}, {"type":
   "number"}], "items": False, "minItems": 2}, [1.5, -2])
ok("prefixItems then items", {"type": "array", "prefixItems": [{"const": "head"}],
                              "items": {"type": "integer"}}, ["head", 1, 2])
ok("draft-7 tuple", {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                     "items": [{"type": "string"}, {"type": "boolean"}],
                     "additionalItems": False}, ["a", True])
ok("properties", {"type": "object", "properties": {"a": {"type": "integer"}}}, {}, {"a": 1},
   {"a": 1, "b": "extra"})
ok("required", {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"]},
   {"a": 1}, {"a": 1, "b": 2})
ok("required unlisted", {"type": "object", "required": ["x"]}, {"x": 1})
ok("additionalProperties false", obj({"a": {"type": "string"}}), {"a": "x"})
ok("additionalProperties schema", {"type": "object", "additionalProperties":
                                   {"type": "integer"}}, {}, {"a": 1, "b": 2})
ok("patternProperties", {"type": "object", "patternProperties": {"^s_": {"type": "string"},
                                                                 "^n_": {"type": "number"}},
                         "additionalProperties": False}, {"s_a": "x", "n_b": 1.5}, {})
ok("patternProperties beside properties", {"type": "object", "properties": {"id": {"type":
   "integer"}}, "patternProperties": {"^x-": {}}, "required": ["id"],
   "additionalProperties": False}, {"id": 1, "x-trace": [1]})
ok("minProperties", {"type": "object", "minProperties": 2}, {"a": 1, "b": 2})
ok("maxProperties", {"type": "object", "maxProperties": 2}, {}, {"a": 1, "b": 2})
ok("properties count range", {"type": "object", "additionalProperties": {"type": "boolean"},
                              "minProperties": 1, "maxProperties": 3}, {"x": True})
ok("128 optional properties", {"type": "object", "properties": {
    f"p{i}": {"type": "integer"} for i in range(128)}}, {"p0": 1, "p127": 2}, {})
ok("allOf types", {"allOf": [{"type": "integer"}, {"minimum": 5}, {"maximum": 9}]}, 5, 9)
ok("allOf objects", {"allOf": [obj({"a": {"type": "integer"}}, additionalProperties=True),
                               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
   {"a": 1, "b": "x"})
ok("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}, 7, "ab")
ok("anyOf objects", {"anyOf": [obj({"a": {"type": "integer"}}), obj({"b": {"type":
   "string"}})]}, {"a": 1}, {"b": "x"})
ok("oneOf apart", {"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type":
   "integer"}}]}, True, [1])
ok("oneOf consts", {"oneOf": [{"const": "a"}, {"const": "b"}]}, "a", "b")
ok("nullable (ignored)", {"type": "string", "nullable": True}, "a")
ok("annotations", {"type": "string", "title": "T", "description": "D", "default": "x",
                   "examples": ["y"], "deprecated": True, "readOnly": True,
                   "$comment": "c", "contentMediaType": "text/plain"}, "z")
ok("$schema 2020-12", {"$schema": "https://json-schema.org/draft/2020-12/schema",
                       "type": "integer"}, 1)
ok("$id", {"$id": "https://example.com/s", "type": "object", "properties": {"a": {"$ref":
   "#/$defs/a"}}, "$defs": {"a": {"type": "integer"}}}, {"a": 1})
ok("$ref $defs", {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "array",
                  "items": {"$ref": "#/$defs/pos"}}, [1, 2])
ok("$ref definitions", {"definitions": {"s": {"type": "string"}}, "type": "object",
                        "properties": {"a": {"$ref": "#/definitions/s"}}}, {"a": "x"})
ok("$ref chain", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"},
                            "c": {"type": "boolean"}}, "$ref": "#/$defs/a"}, False)
ok("$ref to property", {"type": "object", "properties": {"a": {"type": "integer"},
                        "b": {"$ref": "#/properties/a"}}}, {"a": 1, "b": 2})

for keyword, schema in [
        ("uniqueItems", {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        ("contains", {"type": "array", "contains": {"type": "integer"}}),
        ("minContains", {"type": "array", "contains": {"const": 1}, "minContains": 2}),
        ("maxContains", {"type": "array", "contains": {"const": 1}, "maxContains": 2}),
        ("propertyNames", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}),
        ("dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]}}),
        ("dependentSchemas", {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}),
        ("dependencies", {"type": "object", "dependencies": {"a": ["b"]}}),
        ("unevaluatedProperties", {"type": "object", "allOf": [{"properties": {"a": {}}}],
                                   "unevaluatedProperties": False}),
        ("unevaluatedItems", {"type": "array", "prefixItems": [{}], "unevaluatedItems": False}),
        ("not", {"not": {"type": "null"}}),
        ("not", {"type": "string", "not": {"enum": ["admin", "root"]}}),
        ("if", {"type": "object", "if": {"properties": {"kind": {"const": "a"}}},
                "then": {"required": ["a"]}, "else": {"required": ["b"]}}),
        ("oneOf", {"oneOf": [{"type": "number"}, {"type": "integer"}]}),
        ("oneOf", {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}),
        ("$dynamic", {"$dynamicAnchor": "node", "type": "object", "properties": {
            "next": {"$dynamicRef": "#node"}}}),
        ("uniqueItems", obj({"tags": {"type": "array", "uniqueItems": True}})),
        ("propertyNames", obj({"env": {"type": "object", "propertyNames": {"maxLength": 8},
                                       "additionalProperties": {"type": "string"}}})),
]:
    unenforced(f"unenforced {keyword} {len(CORPUS)}", schema, keyword)

# -- formats -------------------------------------------------------------------------------

for fmt, value in [("date-time", "2025-06-01T12:30:00Z"),
                   ("date-time", "2025-06-01T12:30:00.5+02:00"),
                   ("date", "2025-06-01"), ("time", "12:30:00Z"), ("duration", "P3DT4H5M"),
                   ("email", "first.last@example.co.uk"), ("hostname", "db-1.internal"),
                   ("ipv4", "192.168.0.1"), ("ipv6", "2001:db8::8a2e:370:7334"),
                   ("uri", "https://example.com/path?q=1#frag"), ("uri", "urn:isbn:0451450523"),
                   ("uuid", "f81d4fae-7dec-11d0-a765-00a0c91e6bf6")]:
    ok(f"format {fmt} {value}", {"type": "string", "format": fmt}, value)
ok("format in object", obj({"when": {"type": "string", "format": "date"},
                            "who": {"type": "string", "format": "email"}}),
   {"when": "2024-02-29", "who": "a@b.io"})
ok("format beside maxLength", {"type": "string", "format": "ipv4", "maxLength": 15},
   "10.0.0.1")
for fmt in ("uri-reference", "iri", "iri-reference", "idn-email", "idn-hostname",
            "uri-template", "json-pointer", "relative-json-pointer", "regex", "int64",
            "binary", "password"):
    unenforced(f"format {fmt}", {"type": "string", "format": fmt}, fmt)

# -- nesting -------------------------------------------------------------------------------


def nest_objects(depth: int) -> tuple[dict, Any]:
    schema: dict = {"type": "integer"}
    value: Any = depth
    for i in range(depth):
        schema, value = obj({f"l{i}": schema}), {f"l{i}": value}
    return schema, value


def nest_arrays(depth: int) -> tuple[dict, Any]:
    schema: dict = {"type": "string", "maxLength": 4}
    value: Any = "leaf"
    for _ in range(depth):
        schema, value = {"type": "array", "items": schema, "minItems": 1}, [value]
    return schema, value


for depth in (1, 2, 3, 5, 8, 12, 20, 31, 40):
    # indented by 2, a line deeper than 32 starts with more whitespace than JSON_OPTIONS lets
    # a model write at one place: such depths are checked as compact JSON
    indents = (None, 2) if depth < 32 else (None,)
    ok(f"objects nested {depth}", *nest_objects(depth), indents=indents)
    ok(f"arrays nested {depth}", *nest_arrays(depth), indents=indents)
ok("arrays of objects of arrays", {"type": "array", "items": obj({
    "rows": {"type": "array", "items": {"type": "array", "items": {"type": "number"},
                                        "minItems": 2, "maxItems": 2}}})},
   [{"rows": [[1, 2], [3.5, -4]]}], [])
ok("minItems 1000 three deep", {"type": "array", "minItems": 2, "items": {"type": "array",
   "minItems": 2, "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1000}}},
   [[[1] * 1000] * 2] * 2)
ok("wide object", obj({f"field_{i}": {"type": ["integer", "null"]} for i in range(60)}),
   {f"field_{i}": (i if i % 2 else None) for i in range(60)})

# -- $ref cycles ---------------------------------------------------------------------------

LIST = {"$defs": {"node": obj({"value": {"type": "integer"}, "next": {"anyOf": [
    {"$ref": "#/$defs/node"}, {"type": "null"}]}})}, "$ref": "#/$defs/node"}
ok("linked list", LIST, {"value": 1, "next": {"value": 2, "next": None}})
TREE = {"$defs": {"tree": obj({"name": {"type": "string"}, "children": {
    "type": "array", "items": {"$ref": "#/$defs/tree"}}})}, "$ref": "#/$defs/tree"}
ok("tree", TREE, {"name": "root", "children": [{"name": "a", "children": []},
                                               {"name": "b", "children": [
                                                   {"name": "c", "children": []}]}]},
   prompt="Give a small family tree of three names as JSON.")
ok("mutual recursion", {"$defs": {
    "a": obj({"b": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]}}),
    "b": obj({"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}})},
    "$ref": "#/$defs/a"}, {"b": {"a": {"b": None}}})
JSON_VALUE = {"$defs": {"json": {"anyOf": [
    {"type": ["string", "number", "boolean", "null"]},
    {"type": "array", "items": {"$ref": "#/$defs/json"}},
    {"type": "object", "additionalProperties": {"$ref": "#/$defs/json"}}]}},
    "$ref": "#/$defs/json"}
ok("json value", JSON_VALUE, {"a": [1, "x", None, {"b": True}]}, 3)
ok("root self reference", {"type": "object", "properties": {"name": {"type": "string"},
                           "parent": {"$ref": "#"}}, "required": ["name"]},
   {"name": "a", "parent": {"name": "b"}})
ok("expression", {"$defs": {"expr": {"anyOf": [
    {"type": "number"},
    obj({"op": {"enum": ["+", "-", "*", "/"]}, "args": {"type": "array", "minItems": 2,
                                                         "maxItems": 2, "items": {
                                                             "$ref": "#/$defs/expr"}}})]}},
    "$ref": "#/$defs/expr"}, {"op": "+", "args": [1, {"op": "*", "args": [2, 3]}]})
invalid("cycle beside sibling keywords", {"anyOf": [{"type": "null"}, {"$ref": "#"}],
                                          "type": ["object", "null"],
                                          "properties": {"n": {"$ref": "#"}}},
        "circular")

# -- unions --------------------------------------------------------------------------------

ok("nullable by type list", obj({"a": {"type": ["string", "null"]}}), {"a": None}, {"a": "x"})
ok("nullable by anyOf", obj({"a": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}),
   {"a": 3}, {"a": None})
ok("union of objects by const", {"anyOf": [
    obj({"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}}),
    obj({"kind": {"const": "rect"}, "w": {"type": "number"}, "h": {"type": "number"}})]},
   {"kind": "circle", "r": 2}, {"kind": "rect", "w": 1, "h": 2},
   prompt="Describe a circle of radius 2 as JSON.")
ok("oneOf discriminated", {"oneOf": [
    obj({"type": {"const": "a"}, "x": {"type": "integer"}}),
    obj({"type": {"const": "b"}, "y": {"type": "string"}})]}, {"type": "b", "y": "s"})
ok("anyOf of enums", {"anyOf": [{"enum": ["a", "b"]}, {"enum": [1, 2]}]}, "b", 1)
ok("anyOf nested anyOf", {"anyOf": [{"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                    {"type": "string", "format": "date"}]}, None, "2024-01-01")
ok("type list with bounds", {"type": ["integer", "string"], "minimum": 1, "maxLength": 2},
   1, "ab")
ok("array of unions", {"type": "array", "items": {"anyOf": [{"type": "string"}, obj({
    "n": {"type": "integer"}})]}}, ["a", {"n": 1}])
ok("anyOf with $ref", {"$defs": {"p": obj({"x": {"type": "number"}, "y": {"type": "number"}})},
                       "anyOf": [{"$ref": "#/$defs/p"}, {"type": "array", "items": {
                           "$ref": "#/$defs/p"}}]}, {"x": 1, "y": 2}, [{"x": 0, "y": 0}])
ok("allOf with $ref", {"$defs": {"base": {"type": "object", "properties": {"id": {
    "type": "integer"}}, "required": ["id"]}}, "allOf": [{"$ref": "#/$defs/base"}, {
        "properties": {"name": {"type": "string"}}, "required": ["name"]}]},
   {"id": 1, "name": "n"})

# -- schemas no grammar can be made from ---------------------------------------------------

invalid("empty enum", {"enum": []}, "")
invalid("unknown type", {"type": "frog"}, "frog")
invalid("lookahead", {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"}, "")
invalid("backreference", {"type": "string", "pattern": "^(a)\\1$"}, "")
invalid("lengths crossed", {"type": "string", "minLength": 5, "maxLength": 2}, "")
invalid("items crossed", {"type": "array", "minItems": 3, "maxItems": 1}, "")
invalid("range crossed", {"type": "integer", "minimum": 5, "maximum": 1}, "")
invalid("missing $ref", {"$ref": "#/$defs/missing"}, "missing")
invalid("remote $ref", {"$ref": "https://example.com/schema.json"}, "")
invalid("allOf contradicting", {"allOf": [{"type": "string"}, {"type": "integer"}]}, "")
invalid("required but forbidden", {"type": "object", "properties": {}, "required": ["a"],
                                   "additionalProperties": False}, "")
invalid("schema is a list", [{"type": "string"}], "JSON schema object",
        "response_format.json_schema")
invalid("schema is true", True, "JSON schema object", "response_format.json_schema")
invalid("over the parser limits", {"enum": [f"v{i}" for i in range(100_000)]}, "too big")

# -- Pydantic ------------------------------------------------------------------------------


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Weather(BaseModel):
    city: str = Field(max_length=40)
    unit: Unit = Unit.celsius
    days: int = Field(ge=1, le=14)


class Address(BaseModel):
    street: str
    city: str
    zip: Annotated[str, Field(pattern=r"^\d{5}$")]
    country: Literal["US", "CA", "MX"] = "US"


class Person(BaseModel):
    name: str
    age: Optional[int] = Field(default=None, ge=0, le=150)
    email: str = Field(json_schema_extra={"format": "email"})   # EmailStr needs a package
    addresses: list[Address] = Field(default_factory=list, max_length=3)
    tags: dict[str, str] = {}


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Annotated[Union[Cat, Dog], Field(discriminator="kind")]
    pair: tuple[int, str]
    scores: list[Annotated[float, Field(multiple_of=0.5, ge=0)]]


class Category(BaseModel):
    name: str
    children: list["Category"] = []


class Event(BaseModel):
    id: uuid.UUID
    at: dt.datetime
    day: dt.date
    took: dt.timedelta
    note: Annotated[str, Field(min_length=1, max_length=80)] | None = None


class Step(BaseModel):
    explanation: str
    output: str


class MathReasoning(BaseModel):          # OpenAI's structured-outputs guide
    steps: list[Step]
    final_answer: str


class Rows(BaseModel):
    rows: list[tuple[str, int, bool]]
    matrix: list[list[float]] = Field(min_length=1)


class Tagged(BaseModel):
    tags: set[str]


class Flags(BaseModel):
    flags: frozenset[int]


PYDANTIC = [
    (Weather(city="Paris", days=3), "Weather for Paris for three days as JSON."),
    (Weather(city='Quote "city"', unit=Unit.fahrenheit, days=14), None),
    (Address(street="1 Main St", city="Springfield", zip="12345"),
     "Give a US postal address as JSON."),
    (Person(name="Ann", email="ann@example.com", addresses=[Address(
        street="2 Elm", city="X", zip="54321", country="CA")], tags={"team": "a"}), None),
    (Person(name="Bo", age=30, email="bo@example.org"), None),
    (Pet(pet=Cat(kind="cat", lives=9), pair=(1, "a"), scores=[0, 1.5]), None),
    (Pet(pet=Dog(kind="dog", good=True), pair=(-2, ""), scores=[]), None),
    (Category(name="root", children=[Category(name="leaf")]), None),
    (Event(id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
           at=dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), day=dt.date(2025, 1, 2),
           took=dt.timedelta(hours=1, minutes=2)), None),
    (MathReasoning(steps=[Step(explanation="8x + 7 = -23", output="x = -15/4")],
                   final_answer="x = -3.75"), None),
    (Rows(rows=[("a", 1, True)], matrix=[[1.0, 2.5]]), None),
]
for model, prompt in PYDANTIC:
    ok(f"pydantic {type(model).__name__} {len(CORPUS)}", type(model).model_json_schema(),
       model.model_dump(mode="json"), prompt=prompt)
for model_class in (Tagged, Flags):            # sets: uniqueItems, not enforced
    unenforced(f"pydantic {model_class.__name__}", model_class.model_json_schema(),
               "uniqueItems")
ok("pydantic serialization schema", Person.model_json_schema(mode="serialization"),
   Person(name="C", email="c@d.io").model_dump(mode="json"))

# -- Zod (zod-to-json-schema 3.x: draft-07; Zod 4's z.toJSONSchema: 2020-12) ---------------

DRAFT7 = "http://json-schema.org/draft-07/schema#"
ok("zod object", {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1}, "age": {"type": "number"},
    "admin": {"type": "boolean", "default": False}},
    "required": ["name", "age"], "additionalProperties": False, "$schema": DRAFT7},
   {"name": "x", "age": 3.5}, {"name": "y", "age": 0, "admin": True},
   prompt="A user named Ada, aged 36, as JSON.")
ok("zod int", {"type": "integer", "exclusiveMinimum": 0, "$schema": DRAFT7}, 1)
ok("zod enum", {"type": "string", "enum": ["draft", "published"], "$schema": DRAFT7}, "draft")
ok("zod literal", {"type": "string", "const": "v1", "$schema": DRAFT7}, "v1")
ok("zod nullable", {"type": ["string", "null"], "$schema": DRAFT7}, None)
ok("zod optional nullable object", {"type": "object", "properties": {
    "a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "additionalProperties": False,
    "$schema": DRAFT7}, {}, {"a": None})
ok("zod union", {"anyOf": [{"type": "string"}, {"type": "number"}], "$schema": DRAFT7}, 1.5)
ok("zod discriminated union", {"anyOf": [
    {"type": "object", "properties": {"status": {"type": "string", "const": "ok"},
                                      "data": {"type": "string"}},
     "required": ["status", "data"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"type": "string", "const": "error"},
                                      "code": {"type": "integer"}},
     "required": ["status", "code"], "additionalProperties": False}], "$schema": DRAFT7},
   {"status": "error", "code": 404}, prompt="An API response for a page not found, as JSON.")
ok("zod record", {"type": "object", "additionalProperties": {"type": "number"},
                  "$schema": DRAFT7}, {"a": 1})
ok("zod tuple", {"type": "array", "minItems": 2, "maxItems": 2, "items": [
    {"type": "string"}, {"type": "number"}], "$schema": DRAFT7}, ["a", 1])
ok("zod nonempty array", {"type": "array", "items": {"type": "string"}, "minItems": 1,
                          "$schema": DRAFT7}, ["a"])
ok("zod string checks", {"type": "string", "minLength": 3, "maxLength": 20,
                         "pattern": "^[a-z0-9_]+$", "$schema": DRAFT7}, "user_01")
ok("zod email url uuid", {"type": "object", "properties": {
    "email": {"type": "string", "format": "email"}, "site": {"type": "string", "format": "uri"},
    "id": {"type": "string", "format": "uuid"}, "at": {"type": "string",
                                                      "format": "date-time"}},
    "required": ["email", "site", "id", "at"], "additionalProperties": False,
    "$schema": DRAFT7}, {"email": "a@b.co", "site": "https://a.b",    # in the schema's order
                         "id": "00000000-0000-4000-8000-000000000000",
                         "at": "2020-01-01T00:00:00Z"})
ok("zod $ref to a property", {"type": "object", "properties": {
    "home": {"type": "object", "properties": {"city": {"type": "string"}},
             "required": ["city"], "additionalProperties": False},
    "work": {"$ref": "#/properties/home"}}, "required": ["home", "work"],
    "additionalProperties": False, "$schema": DRAFT7},
   {"home": {"city": "a"}, "work": {"city": "b"}})
ok("zod definitions", {"$ref": "#/definitions/Item", "definitions": {"Item": {
    "type": "object", "properties": {"id": {"type": "integer"}, "sub": {"type": "array",
                                                                         "items": {"$ref":
                                                                         "#/definitions/Item"}}},
    "required": ["id", "sub"], "additionalProperties": False}}, "$schema": DRAFT7},
   {"id": 1, "sub": [{"id": 2, "sub": []}]})
ok("zod number bounds", {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.5,
                         "$schema": DRAFT7}, 99.5)
ok("zod date", {"type": "string", "format": "date-time", "$schema": DRAFT7},
   "2024-05-06T07:08:09.123Z")
ok("zod intersection", {"allOf": [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    {"type": "object", "properties": {"b": {"type": "number"}}, "required": ["b"]}],
    "$schema": DRAFT7}, {"a": "x", "b": 1})
unenforced("zod set", {"type": "array", "uniqueItems": True, "items": {"type": "string"},
                       "$schema": DRAFT7}, "uniqueItems")
ok("zod bigint", {"type": "integer", "format": "int64", "$schema": DRAFT7}, 2**40)  # a string
# format on another type is an annotation, as JSON Schema says
Z4 = "https://json-schema.org/draft/2020-12/schema"
ok("zod4 object", {"$schema": Z4, "type": "object", "properties": {
    "title": {"type": "string", "maxLength": 60}, "done": {"type": "boolean"},
    "priority": {"type": "integer", "minimum": -9007199254740991,
                 "maximum": 9007199254740991}},
    "required": ["title", "done", "priority"], "additionalProperties": False},
   {"title": "t", "done": False, "priority": 2},
   prompt="A to-do item to buy milk, not done, priority 2, as JSON.")
ok("zod4 tuple", {"$schema": Z4, "type": "array", "prefixItems": [{"type": "string"},
                                                                  {"type": "number"}]},
   ["a", 1])
ok("zod4 nullable", {"$schema": Z4, "anyOf": [{"type": "string"}, {"type": "null"}]}, None)
ok("zod4 exclusive", {"$schema": Z4, "type": "number", "exclusiveMinimum": 0}, 0.1)
ok("zod4 iso date", {"$schema": Z4, "type": "string", "format": "date",
                     "pattern": "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|"
                                "[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|"
                                "1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|"
                                "[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$"}, "2024-02-29")
invalid("zod4 email pattern (lookaheads)", {"$schema": Z4, "type": "string", "format": "email",
                                            "pattern": "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-"
                                                       "\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9"
                                                       "\\-]*\\.)+[A-Za-z]{2,}$"}, "")

# -- generated: the same shapes over many fields, as tools' parameters often are ------------

SCALARS = [({"type": "string", "maxLength": 8}, "abc"), ({"type": "integer"}, -4),
           ({"type": "number", "minimum": 0}, 0.5), ({"type": "boolean"}, True),
           ({"enum": ["x", "y"]}, "y"), ({"type": "string", "format": "date"}, "2023-03-04"),
           ({"type": ["null", "integer"]}, None), ({"const": 7}, 7)]
for i in range(48):
    picked = [SCALARS[(i + k * 3) % len(SCALARS)] for k in range(1 + i % 6)]
    props = {f"f{k}": s for k, (s, _) in enumerate(picked)}
    value = {f"f{k}": v for k, (_, v) in enumerate(picked)}
    required = list(props)[: (i % 3) + 1] if i % 2 else None
    schema = obj(props, required) if i % 4 else {"type": "array", "items": obj(props, required),
                                                 "maxItems": 4}
    ok(f"fields {i}", schema, value if i % 4 else [value, value])


def by_id(cases):
    return pytest.mark.parametrize("case", cases, ids=[c.name for c in cases])


def test_the_corpus_is_large_and_its_instances_are_valid():
    assert len(CORPUS) >= 200 and len({c.name for c in CORPUS}) == len(CORPUS)
    for case in CORPUS:
        assert case.instances or case.unenforced or case.invalid is not None, case.name
        for value in case.instances:
            jsonschema.validate(value, case.schema)


@pytest.fixture(scope="module")
def served(tokenizer, chat_template, tmp_path_factory):
    """One app on the scripted engine for the whole corpus; it records what it is sent."""
    engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, chat_template, created=0),
                            lambda request: "{}")
    settings = Settings(store_url=f"sqlite:///{tmp_path_factory.mktemp('c') / 'r.db'}")
    with TestClient(create_app(settings, engine), raise_server_exceptions=False) as client:
        yield client, engine


def ask(client, schema, strict):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": strict,
                                                  "schema": schema}}
    return client.post("/v1/chat/completions", json={
        "model": SERVED, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4, "response_format": fmt})


@by_id(CORPUS)
def test_a_schema_is_accepted_and_its_instances_in_the_grammar_or_refused_naming_why(
        served, matchers, caplog, case):
    client, engine = served
    r = ask(client, case.schema, strict=True)
    if case.instances:
        assert r.status_code == 200, r.text
        grammar = engine.requests[-1].sampling.grammar
        matchers.grammars.check(grammar)            # as the engine compiles it
        for value in case.instances:
            assert matchers.accepts_json(grammar, value, case.indents), value
        return
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    says = case.unenforced or case.invalid
    assert error["param"] == case.param and says in error["message"], error
    with caplog.at_level(logging.WARNING, logger="podium.grammar.build"):
        r = ask(client, case.schema, strict=False)
    if case.invalid is not None:
        assert r.status_code == 400, r.text
        return
    assert r.status_code == 200, r.text               # left out, said in the log
    assert any(PARAM in m.getMessage() and case.unenforced in m.getMessage()
               for m in caplog.records)
    matchers.grammars.check(engine.requests[-1].sampling.grammar)


SAMPLED = [c for c in CORPUS if c.prompt]


@by_id(SAMPLED)
def test_the_real_model_writes_valid_json_for_a_sample(real, case):
    assert 5 <= len(SAMPLED) <= 10
    generate(real, case.schema, case.prompt, stream=SAMPLED.index(case) % 2 == 1,
             max_tokens=200)

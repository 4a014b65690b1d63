"""A JSON schema as the regex its answers match: the schema read (a dict, a JSON string or
a pydantic model class), checked against the keywords this can enforce, then turned into a
regex by outlines-core.

Enforced: `type` (object, array, string, number, integer, boolean, null, or a list of
them), `properties`, `required`, `additionalProperties: false`, `items`, `minItems`,
`maxItems`, `enum`, `const`, `anyOf`, `minLength`, `maxLength`, `pattern`,
`format` (date-time, date, time, uuid, email, uri) and local references (`$ref` into
`$defs` / `definitions`): OpenAI's strict subset and more. Annotations (`title`,
`description`, `default`, `examples`, `$schema`, `$id`, `$comment`) are read and ignored.
Any other keyword (`minimum`, `multipleOf`, `oneOf`: its choice is exclusive, which a
regex cannot keep; `patternProperties`, `not`, ...) is refused
with its place in the schema: a constraint that is not enforced would let an answer
through that the schema forbids.

Whitespace: none between tokens of structure (`{"a":1}`), so that the grammar forces the
most tokens (each a guess a lookahead step cannot miss).
"""

from __future__ import annotations

import json

from lookahead_jax.errors import UserInputError

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment"}
ENFORCED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "$ref",
    "$defs",
    "definitions",
}
FORMATS = {"date-time", "date", "time", "uuid", "email", "uri"}
TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def as_schema(schema) -> dict:
    """The schema as a dict: from a dict, a JSON string or a pydantic model class."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise UserInputError(f"json_schema is not valid JSON: {e}") from None
    elif isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()  # a pydantic model class
    if not isinstance(schema, dict):
        raise UserInputError(
            f"json_schema must be an object (a dict, a JSON string or a pydantic model "
            f"class), got {type(schema).__name__}"
        )
    return schema


def check(schema, path: str = "$") -> None:
    """Refuse a keyword or value this cannot enforce, naming its path ($.properties.x)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise UserInputError(f"json_schema: {path} must be a schema (an object)")
    for key, value in schema.items():
        at = f"{path}.{key}"
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            raise UserInputError(f"json_schema: {at} ({key!r}) is not supported")
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            unknown = [k for k in kinds if k not in TYPES]
            if unknown:
                raise UserInputError(f"json_schema: {at} names unknown types {unknown}")
        elif key == "additionalProperties" and value is not False:
            raise UserInputError(
                f"json_schema: {at} must be false (or left out): other properties than the "
                "listed ones are not supported"
            )
        elif key == "format" and value not in FORMATS:
            raise UserInputError(
                f"json_schema: {at} {value!r} is not supported (supported: "
                f"{', '.join(sorted(FORMATS))})"
            )
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise UserInputError(f"json_schema: {at} must be an object")
            for name, sub in value.items():
                check(sub, f"{at}.{name}")
        elif key == "items":
            check(value, at)
        elif key == "required":
            named = schema.get("properties", {})
            missing = [n for n in value if n not in named] if isinstance(value, list) else None
            if missing is None or missing:
                raise UserInputError(
                    f"json_schema: {at} must list names of {path}.properties, got {value!r}"
                )
        elif key == "anyOf":
            if not isinstance(value, list) or not value:
                raise UserInputError(f"json_schema: {at} must be a non-empty list of schemas")
            for i, sub in enumerate(value):
                check(sub, f"{at}[{i}]")
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            raise UserInputError(f"json_schema: {at} {value!r}: only local references (#/...)")


def to_regex(schema) -> tuple[str, str]:
    """(the schema's JSON text, the regex its answers match; properties in the schema's
    order, which the answers follow)."""
    from outlines_core.json_schema import build_regex_from_schema

    schema = as_schema(schema)
    check(schema)
    text = json.dumps(schema)
    try:
        return text, build_regex_from_schema(text, "")
    except (ValueError, TypeError) as e:
        raise UserInputError(f"json_schema: {e}") from None

"""Payload encoding at enqueue, and decoding + schema validation in the harness (SPEC H1, R3).

A payload travels as bytes, exactly as enqueued. At the harness it is decoded and validated
against the consumer's schema; anything that fails is *poison*: it will never become valid,
so it goes to dead letters with zero retries and the bytes are kept as they were.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pydantic

from ..errors import ConfigurationError, PoisonPayload

Schema = type[pydantic.BaseModel] | Mapping[str, Any] | type[bytes] | None


def encode(payload: Any) -> bytes:
    """Turn what a caller passes to ``enqueue`` into the bytes that travel.

    ``bytes`` go as they are (that is how a raw or foreign message is enqueued); a pydantic
    model is dumped as JSON; anything else must be JSON-serialisable.
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    if isinstance(payload, pydantic.BaseModel):
        return payload.model_dump_json().encode()
    try:
        return json.dumps(
            payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload is not JSON-serialisable: {exc}") from exc


class Decoder:
    """Validates raw payload bytes against one consumer's schema."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._validator: Any = None
        if schema is None or schema is bytes:
            return
        if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
            return
        if isinstance(schema, Mapping):
            import jsonschema

            try:
                cls = jsonschema.validators.validator_for(schema)
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigurationError(f"invalid JSON Schema: {exc.message}") from exc
            self._validator = cls(schema)
            return
        raise ConfigurationError(
            "schema must be a pydantic model class, a JSON Schema dict, bytes (raw) or None "
            f"(any JSON); got {schema!r}"
        )

    @property
    def description(self) -> str:
        if self.schema is None:
            return "any JSON"
        if self.schema is bytes:
            return "raw bytes"
        if isinstance(self.schema, type):
            return f"pydantic model {self.schema.__qualname__}"
        return "JSON Schema"

    def decode(self, raw: bytes) -> Any:
        """Return the validated payload, or raise :class:`PoisonPayload`."""
        schema = self.schema
        if schema is bytes:
            return raw
        if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
            try:
                return schema.model_validate_json(raw)
            except pydantic.ValidationError as exc:
                raise PoisonPayload(_pydantic_message(exc)) from None
            except (ValueError, RecursionError) as exc:
                raise PoisonPayload(f"payload is not valid JSON: {exc}") from None
        try:
            value = json.loads(raw)
        except UnicodeDecodeError as exc:
            raise PoisonPayload(f"payload is not valid UTF-8: {exc}") from None
        except json.JSONDecodeError as exc:
            raise PoisonPayload(f"payload is not valid JSON: {exc}") from None
        except RecursionError:
            raise PoisonPayload("payload is not valid JSON: nested too deeply") from None
        if self._validator is not None:
            try:
                error = next(iter(self._validator.iter_errors(value)), None)
            except RecursionError:
                raise PoisonPayload("payload nested too deeply to validate") from None
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "(root)"
                raise PoisonPayload(
                    f"payload does not match the schema at {where}: {error.message}"
                )
        return value


def _pydantic_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    suffix = f" (+{more} more)" if more > 0 else ""
    return "payload does not match the schema: " + "; ".join(parts) + suffix

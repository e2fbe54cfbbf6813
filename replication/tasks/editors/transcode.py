"""Transcoding: Avro <-> JSON and content compression, the editor pattern's "transcode".

A source may produce Apache Avro (raw binary with a known schema, single-object encoding, or
object container files) while the target's consumers expect JSON, or the other way round; or a
body is compressed to fit a size limit. ``transcode`` decodes the body into an in-memory value
and encodes it again, so a replica carries the same data in the form its consumers read.

Order of work: ``decompress`` -> decode ``from`` -> encode ``to`` -> ``compress``.

Content types set on the output (override with ``content_type``):

=====================  =====================  ===============================================
format                 content type           body
=====================  =====================  ===============================================
``json``               ``application/json``   UTF-8 JSON
``avro-binary``        ``avro/binary``        one datum, Avro binary encoding (as the Avro
                                              spec's HTTP transport names it)
``avro-single-object`` ``avro/single-object`` ``C3 01`` + 8-byte little-endian CRC-64-AVRO
                                              fingerprint of the schema + the binary datum
``avro-container``     ``avro/container``     an Avro object container file (schema inside)
=====================  =====================  ===============================================

Service Bus has no content-encoding field, so compression is recorded HTTP-style in the
application property ``content-encoding`` (``gzip`` or ``deflate``; stacked codings are listed
in the order applied, ``"deflate, gzip"``); the content type stays that of the uncompressed
body. ``deflate`` means the zlib format (RFC 1950) as in HTTP; raw deflate is accepted too when
decompressing.

JSON mapping of Avro values (both ways, guided by the schema when writing Avro): records and
maps are objects, arrays are arrays, ``bytes`` and ``fixed`` are base64 strings, enums are
strings, unions are the plain value of the branch (the first branch the value fits),
``decimal`` is a string (numbers are accepted when writing), ``uuid`` a string, ``date``,
``time-*`` and ``timestamp-*`` ISO 8601 strings (UTC timestamps end in ``Z``; integers in the
logical type's unit are accepted when writing). A record field that is missing in the JSON
takes its default (written as the Avro spec writes defaults); a field whose type is a union
with ``null`` may be left out (null). Fields the schema does not name are ignored. An Avro
container becomes a JSON array of its records; JSON becomes a container of the array's
elements (or of the one value, if not an array).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import decimal
import gzip
import io
import json
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from pydantic import ConfigDict, Field, model_validator

from ...messages import Message
from ..steps import Step, StepConfigError, StepContext, StepFailed, StepOptions, step

Format = Literal["json", "avro-binary", "avro-single-object", "avro-container"]
AvroFormat = Literal["avro-binary", "avro-single-object", "avro-container"]
Coding = Literal["gzip", "deflate"]
AvroSchemaJson = dict[str, Any] | list[Any] | str

CONTENT_TYPES: dict[str, str] = {
    "json": "application/json",
    "avro-binary": "avro/binary",
    "avro-single-object": "avro/single-object",
    "avro-container": "avro/container",
}
CONTENT_ENCODING = "content-encoding"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONTAINER_CODECS = Literal["null", "deflate", "bzip2"]

_MiB = 1024 * 1024


# ---------------------------------------------------------------------- JSON bodies


def parse_json(body: bytes) -> Any:
    """The JSON value of a UTF-8 body (a BOM is tolerated); ``StepFailed`` if it is not JSON."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise StepFailed("invalid JSON body", f"not UTF-8: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StepFailed(
            "invalid JSON body", f"line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def dump_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; ``StepFailed`` for values JSON cannot hold (NaN, infinity)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
            "utf-8"
        )
    except (TypeError, ValueError) as exc:
        raise StepFailed("value not representable in JSON", str(exc)) from None


# ---------------------------------------------------------------------- Avro schemas


@dataclass(frozen=True)
class AvroSchema:
    """A parsed Avro schema with what encoding needs: named types and the fingerprint."""

    parsed: Any
    named: dict[str, Any] = field(repr=False)
    fingerprint: bytes
    """The 8-byte CRC-64-AVRO fingerprint as single-object encoding writes it."""

    @classmethod
    def parse(cls, schema: Any) -> AvroSchema:
        named: dict[str, Any] = {}
        try:
            parsed = parse_schema(schema, named_schemas=named)
            canonical = to_parsing_canonical_form(parsed)
        except Exception as exc:  # fastavro raises several types for bad schemas
            raise StepConfigError(f"invalid Avro schema: {type(exc).__name__}: {exc}") from None
        return cls(parsed, named, bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")))


def load_avro_schema(inline: AvroSchemaJson | None, path: str | None) -> AvroSchema | None:
    """The schema given inline (a JSON object/array, JSON text, or a primitive type name) or
    in a file (``.avsc``); None when neither is given. Errors are configuration errors."""
    if inline is not None and path is not None:
        raise StepConfigError("give the Avro schema inline or as a file, not both")
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise StepConfigError(f"cannot read Avro schema file {path!r}: {exc}") from None
        try:
            inline = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StepConfigError(f"Avro schema file {path!r} is not JSON: {exc}") from None
    if inline is None:
        return None
    if isinstance(inline, str):
        with contextlib.suppress(json.JSONDecodeError):  # else a bare type name: "string"
            inline = json.loads(inline)
    return AvroSchema.parse(inline)


# ---------------------------------------------------------------------- JSON -> Avro datum


class AvroMismatch(Exception):
    """A JSON value that does not fit the Avro schema, at ``path`` (``$.a.b[0]``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)


def json_to_avro(value: Any, schema: AvroSchema) -> Any:
    """The Avro datum (what fastavro writes) for a JSON value; ``AvroMismatch`` says where it
    does not fit. Values already in fastavro's form (bytes, datetime, Decimal) pass through."""
    return _to_avro(value, schema.parsed, schema.named, "$")


def _type_name(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("logicalType") or schema.get("type"))
    if isinstance(schema, list):
        return "union"
    return str(schema)


def _describe(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _to_avro(value: Any, schema: Any, named: dict[str, Any], path: str) -> Any:
    if isinstance(schema, list):
        problems = []
        for branch in schema:
            try:
                return _to_avro(value, branch, named, path)
            except AvroMismatch as exc:
                problems.append(exc)
        # a value that reached deeper into one branch explains itself best
        deeper = [p for p in problems if p.path != path]
        if len(deeper) == 1:
            raise deeper[0]
        names = ", ".join(_type_name(b) for b in schema)
        raise AvroMismatch(path, f"{_describe(value)} matches none of the union types [{names}]")
    if isinstance(schema, str):
        if schema in named:
            return _to_avro(value, named[schema], named, path)
        return _primitive(value, schema, path)
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical is not None:
        converted = _logical(value, logical, schema, path)
        if converted is not _NOT_LOGICAL:
            return converted
    if kind in ("record", "error"):
        if not isinstance(value, dict):
            raise AvroMismatch(path, f"expected an object for record {schema.get('name')}")
        out = {}
        for item in schema["fields"]:
            name = item["name"]
            if name in value:
                out[name] = _to_avro(value[name], item["type"], named, f"{path}.{name}")
            elif "default" in item:
                out[name] = _default(item["default"], item["type"], named)
            elif not _nullable(item["type"]):
                raise AvroMismatch(f"{path}.{name}", "required field is missing")
        return out
    if kind == "enum":
        if not isinstance(value, str) or value not in schema["symbols"]:
            symbols = ", ".join(schema["symbols"])
            raise AvroMismatch(path, f"{_describe(value)} is not one of the symbols [{symbols}]")
        return value
    if kind == "array":
        if not isinstance(value, list):
            raise AvroMismatch(path, f"expected an array, got {_describe(value)}")
        return [_to_avro(v, schema["items"], named, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "map":
        if not isinstance(value, dict):
            raise AvroMismatch(path, f"expected an object for a map, got {_describe(value)}")
        return {k: _to_avro(v, schema["values"], named, f"{path}.{k}") for k, v in value.items()}
    if kind == "fixed":
        data = _bytes(value, path)
        if len(data) != schema["size"]:
            raise AvroMismatch(path, f"fixed {schema['name']} needs {schema['size']} bytes")
        return data
    return _to_avro(value, kind, named, path)


def _default(value: Any, schema: Any, named: dict[str, Any]) -> Any:
    """A field default in the datum form: defaults are JSON as the Avro spec writes them
    (bytes and fixed as strings of code points 0-255, a union's default for its first type)."""
    if isinstance(schema, list):
        return _default(value, schema[0], named) if schema else value
    if isinstance(schema, str):
        if schema in named:
            return _default(value, named[schema], named)
        return value.encode("latin-1") if schema == "bytes" and isinstance(value, str) else value
    kind = schema.get("type")
    if kind == "fixed" and isinstance(value, str):
        return value.encode("latin-1")
    if kind in ("record", "error") and isinstance(value, dict):
        return {
            f["name"]: _default(value.get(f["name"], f.get("default")), f["type"], named)
            for f in schema["fields"]
            if f["name"] in value or "default" in f
        }
    if kind == "array" and isinstance(value, list):
        return [_default(v, schema["items"], named) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: _default(v, schema["values"], named) for k, v in value.items()}
    if isinstance(kind, str | list | dict) and kind not in _COMPLEX:
        return _default(value, kind, named)
    return value


_COMPLEX = frozenset({"record", "error", "enum", "array", "map", "fixed"})


def _nullable(schema: Any) -> bool:
    return schema == "null" or (isinstance(schema, list) and "null" in schema)


def _primitive(value: Any, kind: str, path: str) -> Any:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == "null":
        if value is not None:
            raise AvroMismatch(path, f"expected null, got {_describe(value)}")
        return None
    if kind == "boolean":
        if not isinstance(value, bool):
            raise AvroMismatch(path, f"expected a boolean, got {_describe(value)}")
        return value
    if kind in ("int", "long"):
        low, high = _INT_RANGE if kind == "int" else _LONG_RANGE
        if not is_int:
            raise AvroMismatch(path, f"expected an integer ({kind}), got {_describe(value)}")
        if not low <= value <= high:
            raise AvroMismatch(path, f"{value} is out of range for {kind}")
        return value
    if kind in ("float", "double"):
        if not (is_int or isinstance(value, float)):
            raise AvroMismatch(path, f"expected a number ({kind}), got {_describe(value)}")
        return float(value)
    if kind == "string":
        if not isinstance(value, str):
            raise AvroMismatch(path, f"expected a string, got {_describe(value)}")
        return value
    if kind == "bytes":
        return _bytes(value, path)
    raise AvroMismatch(path, f"unknown Avro type {kind!r}")


def _bytes(value: Any, path: str) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if not isinstance(value, str):
        raise AvroMismatch(path, f"expected a base64 string, got {_describe(value)}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AvroMismatch(path, "not valid base64") from None


_NOT_LOGICAL = object()


def _logical(value: Any, logical: str, schema: dict[str, Any], path: str) -> Any:
    """Converts JSON forms of logical types; ``_NOT_LOGICAL``: treat as the underlying type."""
    if isinstance(value, int) and not isinstance(value, bool) and logical != "decimal":
        return _NOT_LOGICAL  # epoch-based integers: the underlying int/long
    if logical == "decimal":
        if isinstance(value, decimal.Decimal):
            return value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise AvroMismatch(path, f"expected a decimal string or number, got {value!r}")
        try:
            number = decimal.Decimal(str(value))
        except decimal.InvalidOperation:
            raise AvroMismatch(path, f"{_describe(value)} is not a decimal number") from None
        if not number.is_finite():
            raise AvroMismatch(path, f"{_describe(value)} is not a finite decimal")
        scale = int(schema.get("scale", 0))
        exponent = number.as_tuple().exponent
        if isinstance(exponent, int) and -exponent > scale:
            raise AvroMismatch(path, f"{value} has more than {scale} decimal places")
        return number
    if logical == "uuid":
        if isinstance(value, uuid.UUID):
            return str(value)
        if not isinstance(value, str):
            raise AvroMismatch(path, f"expected a UUID string, got {_describe(value)}")
        try:
            uuid.UUID(value)
        except ValueError:
            raise AvroMismatch(path, f"{_describe(value)} is not a UUID") from None
        return value
    parse = _TIME_PARSERS.get(logical)
    if parse is None:
        return _NOT_LOGICAL
    wanted = parse[0]
    if isinstance(value, wanted):
        return value
    if not isinstance(value, str):
        raise AvroMismatch(path, f"expected an ISO 8601 string for {logical}, got {value!r}")
    try:
        return parse[1](value)
    except ValueError:
        raise AvroMismatch(path, f"{_describe(value)} is not an ISO 8601 {logical}") from None


def _timestamp(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _local_timestamp(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is not None:
        raise ValueError("a local timestamp has no time zone")
    return moment


_TIME_PARSERS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "date": (dt.date, dt.date.fromisoformat),
    "time-millis": (dt.time, dt.time.fromisoformat),
    "time-micros": (dt.time, dt.time.fromisoformat),
    "timestamp-millis": (dt.datetime, _timestamp),
    "timestamp-micros": (dt.datetime, _timestamp),
    "local-timestamp-millis": (dt.datetime, _local_timestamp),
    "local-timestamp-micros": (dt.datetime, _local_timestamp),
}


# ---------------------------------------------------------------------- Avro datum -> JSON


def avro_to_json(value: Any) -> Any:
    """The JSON value of a datum fastavro read (see the module doc for the mapping)."""
    if isinstance(value, dict):
        return {str(k): avro_to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [avro_to_json(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


# ---------------------------------------------------------------------- Avro encodings


def _check_datum(value: Any, schema: AvroSchema) -> Any:
    try:
        return json_to_avro(value, schema)
    except AvroMismatch as exc:
        raise StepFailed("value does not fit the Avro schema", str(exc)) from None


def _write_failed(exc: Exception) -> StepFailed:
    return StepFailed("value does not fit the Avro schema", f"{type(exc).__name__}: {exc}")


def write_avro_binary(datum: Any, schema: AvroSchema) -> bytes:
    checked = _check_datum(datum, schema)
    out = io.BytesIO()
    try:
        fastavro.schemaless_writer(out, schema.parsed, checked)
    except Exception as exc:
        raise _write_failed(exc) from None
    return out.getvalue()


def read_avro_binary(body: bytes, schema: AvroSchema) -> Any:
    reader = io.BytesIO(body)
    try:
        datum = fastavro.schemaless_reader(reader, schema.parsed, None)
    except Exception as exc:
        raise StepFailed(
            "invalid Avro body", f"cannot decode with the schema: {type(exc).__name__}: {exc}"
        ) from None
    left = len(body) - reader.tell()
    if left:
        raise StepFailed("invalid Avro body", f"{left} bytes left over after the datum")
    return datum


def write_single_object(datum: Any, schema: AvroSchema) -> bytes:
    return SINGLE_OBJECT_MAGIC + schema.fingerprint + write_avro_binary(datum, schema)


def read_single_object(body: bytes, schema: AvroSchema) -> Any:
    if len(body) < 10 or body[:2] != SINGLE_OBJECT_MAGIC:
        raise StepFailed("invalid Avro body", "no Avro single-object header (C3 01)")
    found = body[2:10]
    if found != schema.fingerprint:
        raise StepFailed(
            "unknown Avro schema fingerprint",
            f"body was written with schema {found.hex()}, expected {schema.fingerprint.hex()}",
        )
    return read_avro_binary(body[10:], schema)


def write_container(records: list[Any], schema: AvroSchema, codec: str = "null") -> bytes:
    out = io.BytesIO()
    checked = [_check_datum(r, schema) for r in records]
    try:
        fastavro.writer(out, schema.parsed, checked, codec=codec)
    except Exception as exc:
        raise _write_failed(exc) from None
    return out.getvalue()


def read_container(body: bytes, schema: AvroSchema | None) -> tuple[list[Any], AvroSchema]:
    """The records of a container file and the schema they are read with (the reader
    schema if given, else the writer schema from the file)."""
    try:
        reader = fastavro.reader(io.BytesIO(body), schema.parsed if schema else None)
        records = list(reader)
        used = schema or AvroSchema.parse(json.loads(reader.metadata["avro.schema"]))
    except StepConfigError as exc:
        raise StepFailed("invalid Avro container", str(exc)) from None
    except Exception as exc:
        raise StepFailed("invalid Avro container", f"{type(exc).__name__}: {exc}") from None
    return records, used


# ---------------------------------------------------------------------- compression


def compress(body: bytes, coding: str) -> bytes:
    if coding == "gzip":
        # mtime 0: the same body always compresses to the same bytes (dedupe-friendly)
        return gzip.compress(body, mtime=0)
    return zlib.compress(body)


def decompress(body: bytes, coding: str, limit: int = 100 * _MiB) -> bytes:
    """The decompressed body; ``StepFailed`` if corrupt, truncated or larger than ``limit``."""
    if coding == "gzip":
        return _inflate(body, 16 + zlib.MAX_WBITS, "gzip", limit, members=True)
    try:
        return _inflate(body, zlib.MAX_WBITS, "deflate", limit)
    except StepFailed:
        return _inflate(body, -zlib.MAX_WBITS, "deflate", limit)  # raw deflate


def _inflate(body: bytes, wbits: int, coding: str, limit: int, members: bool = False) -> bytes:
    parts: list[bytes] = []
    size = 0
    data = body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            part = inflater.decompress(data, limit - size + 1)
        except zlib.error as exc:
            raise StepFailed(f"invalid {coding} body", str(exc)) from None
        size += len(part)
        if size > limit or inflater.unconsumed_tail:
            raise StepFailed(f"{coding} body too large", f"more than {limit} bytes decompressed")
        parts.append(part)
        if not inflater.eof:
            raise StepFailed(f"invalid {coding} body", "truncated compressed data")
        data = inflater.unused_data
        if not data:
            return b"".join(parts)
        if not members:
            raise StepFailed(f"invalid {coding} body", f"{len(data)} bytes after the end")


def _codings(message: Message) -> list[str]:
    value = message.application_properties.get(CONTENT_ENCODING)
    if value is None or value == "":
        return []
    return [c.strip().lower() for c in str(value).split(",") if c.strip()]


def _with_codings(message: Message, body: bytes, codings: list[str]) -> Message:
    props = dict(message.application_properties)
    if codings:
        props[CONTENT_ENCODING] = ", ".join(codings)
    else:
        props.pop(CONTENT_ENCODING, None)
    return message.copy(body=body, application_properties=props)


def decompress_message(message: Message, coding: str, limit: int) -> Message:
    """Undoes ``coding`` (or, for ``auto``, the last coding the ``content-encoding`` property
    lists; nothing if none) and removes it from the property."""
    codings = _codings(message)
    if coding == "auto":
        if not codings:
            return message
        coding = codings[-1]
        if coding not in ("gzip", "deflate"):
            raise StepFailed("unsupported content-encoding", f"cannot decompress {coding!r}")
    body = decompress(message.body, coding, limit)
    if codings and codings[-1] == coding:
        codings.pop()
    return _with_codings(message, body, codings)


def compress_message(message: Message, coding: str) -> Message:
    return _with_codings(message, compress(message.body, coding), [*_codings(message), coding])


# ---------------------------------------------------------------------- decode / encode


def decode_body(body: bytes, fmt: str, schema: AvroSchema | None) -> tuple[Any, AvroSchema | None]:
    """The body's value (JSON value or Avro datum; a container gives the list of records)
    and the Avro schema it was read with."""
    if fmt == "json":
        return parse_json(body), schema
    if fmt == "avro-container":
        return read_container(body, schema)
    assert schema is not None  # enforced by the options
    if fmt == "avro-binary":
        return read_avro_binary(body, schema), schema
    return read_single_object(body, schema), schema


def encode_body(value: Any, fmt: str, schema: AvroSchema | None, codec: str = "null") -> bytes:
    if fmt == "json":
        return dump_json(avro_to_json(value))
    if schema is None:
        raise StepFailed("no Avro schema", f"{fmt} needs a schema")
    if fmt == "avro-container":
        return write_container(value if isinstance(value, list) else [value], schema, codec)
    if fmt == "avro-binary":
        return write_avro_binary(value, schema)
    return write_single_object(value, schema)


# ---------------------------------------------------------------------- the step


class TranscodeOptions(StepOptions):
    """``from``/``to``: body formats (both or neither); ``schema`` (inline) or
    ``schema_file``: the Avro schema; ``decompress``/``compress``: gzip or deflate."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    from_: Format | None = Field(None, alias="from")
    to: Format | None = None
    schema_: AvroSchemaJson | None = Field(None, alias="schema")
    schema_file: str | None = None
    decompress: Literal["gzip", "deflate", "auto"] | None = None
    compress: Coding | None = None
    content_type: str | None = None
    """Overrides the content type ``to`` implies."""
    container_codec: CONTAINER_CODECS = "null"
    """Block compression inside an Avro container written by ``to: avro-container``."""
    max_decompressed_bytes: int = Field(100 * _MiB, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> TranscodeOptions:
        if (self.from_ is None) != (self.to is None):
            raise ValueError("'from' and 'to' go together")
        if self.from_ is None and self.decompress is None and self.compress is None:
            raise ValueError("nothing to do: give 'from'/'to', 'decompress' or 'compress'")
        if self.schema_ is not None and self.schema_file is not None:
            raise ValueError("give 'schema' or 'schema_file', not both")
        has_schema = self.schema_ is not None or self.schema_file is not None
        # decoding raw Avro needs the schema; encoding Avro too, unless it comes from a
        # container, whose writer schema is then used
        needs: set[str] = {"avro-binary", "avro-single-object"} & {self.from_}
        if self.to is not None and self.to != "json" and self.from_ != "avro-container":
            needs.add(self.to)
        if needs and not has_schema:
            raise ValueError(f"{', '.join(sorted(needs))} needs 'schema' or 'schema_file'")
        if self.content_type is not None and self.to is None:
            raise ValueError("'content_type' needs 'to'")
        return self


@step("transcode", TranscodeOptions)
def build_transcode(options: TranscodeOptions, context: StepContext) -> Step:
    """Re-encodes the body (Avro binary / single-object / container <-> JSON) and
    compresses or decompresses it, so consumers of the target read the form they expect."""
    schema = load_avro_schema(options.schema_, options.schema_file)
    source, target = options.from_, options.to

    def run(message: Message) -> list[Message]:
        if options.decompress is not None:
            message = decompress_message(
                message, options.decompress, options.max_decompressed_bytes
            )
        if source is not None and target is not None:
            if _codings(message):
                raise StepFailed(
                    "body is compressed",
                    f"content-encoding {message.application_properties[CONTENT_ENCODING]!r}:"
                    " decompress first",
                )
            value, used = decode_body(message.body, source, schema)
            if source == "avro-container" and target in ("avro-binary", "avro-single-object"):
                if len(value) != 1:
                    raise StepFailed(
                        "cannot transcode", f"container holds {len(value)} records, {target} one"
                    )
                value = value[0]
            body = encode_body(value, target, schema or used, options.container_codec)
            message = message.copy(
                body=body, content_type=options.content_type or CONTENT_TYPES[target]
            )
        if options.compress is not None:
            message = compress_message(message, options.compress)
        return [message]

    return run

"""Spark's DDL for a schema (``"i long, user string, ts timestamp"``) parsed in Python, without a JVM.

Why: ``StructType.fromDDL`` hands the string to Spark's SQL parser in the JVM, so it needs a
SparkSession. An ingest process has none (``ftlayer ingest --schema``, a producer program beside
the Spark job), yet it checks its records against the schema the query reads
(:mod:`runtime.spark.schema_check`). This parser covers the types a record's columns take:

- ``boolean``; ``tinyint``/``byte``, ``smallint``/``short``, ``int``/``integer``, ``bigint``/``long``;
  ``float``/``real``, ``double``; ``decimal``/``dec``/``numeric`` with ``(p)`` or ``(p, s)`` (default
  ``(10, 0)``); ``string``, ``varchar(n)``, ``char(n)``; ``binary``; ``date``; ``timestamp``,
  ``timestamp_ltz``, ``timestamp_ntz``;
- ``array<T>``, ``map<K, V>``, ``struct<name: T, ...>`` (the colon optional), nested freely;
- per field: a name (letters, digits, ``_``, not digits only; or any text in backquotes, ```` `` ````
  for one), an optional ``:``, ``NOT NULL``, ``COMMENT '...'`` or ``COMMENT "..."`` (kept as the
  field's ``comment`` metadata; a comment with escapes other than ``\\\\``, ``\\'`` and ``\\"`` is
  left to Spark).

Contract: for the DDL it accepts, the result equals ``StructType.fromDDL`` with Spark's default
settings (keywords in any case; ``tests/runtime/spark/test_ddl.py`` compares the two on a real
session). Anything else (an interval type, a decimal beyond 38 digits, a typo) raises
:class:`DDLError` naming the position. :func:`parse_schema` is the entry point: with a SparkSession
it asks Spark's parser (its SQL settings apply), without one this parser. Pure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ftlayer.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructField, StructType

__all__ = ["DDLError", "parse_ddl", "parse_schema"]

_NOT_SPACE = frozenset("\x1c\x1d\x1e\x1f\x85\u2029")  # spaces to Python's \s, not to Spark's lexer
# words Spark's lexer reads as number literals (1L, 1S, 1Y, 1e5, 1D, 1F, 1BD, 1e5D ...), never as a name
_NUMBER_WORD = re.compile(r"\d+(?:[LSY]|(?:E\d+)?(?:D|F|BD)|E\d+)", re.IGNORECASE)
_MAX_INT = 2**31 - 1  # a char/varchar length is a Java int
_MAX_PRECISION = 38  # Spark's DecimalType.MAX_PRECISION
# a word is Spark's IDENTIFIER or INTEGER_VALUE (letters, digits and _: digits only is a number), a string
# is quoted with ' or " (backslash escapes inside)
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z0-9_]+)|('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|([<>(),:]))")


_READS = "the simple types, decimal(p, s), varchar(n), char(n), array, map, struct, NOT NULL, COMMENT"


class DDLError(ConfigError):
    """A schema string this parser does not read (see the module notes for what it reads)."""


def _simple() -> dict[str, Any]:
    from pyspark.sql import types as t

    return {"boolean": t.BooleanType, "tinyint": t.ByteType, "byte": t.ByteType, "smallint": t.ShortType,
            "short": t.ShortType, "int": t.IntegerType, "integer": t.IntegerType, "bigint": t.LongType,
            "long": t.LongType, "float": t.FloatType, "real": t.FloatType, "double": t.DoubleType,
            "string": t.StringType, "binary": t.BinaryType, "date": t.DateType, "timestamp": t.TimestampType,
            "timestamp_ltz": t.TimestampType, "timestamp_ntz": t.TimestampNTZType}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, position)
        odd = next((i for i, ch in enumerate(text) if ch in _NOT_SPACE), None)
        if odd is not None:
            self._fail(odd, "a control character Spark's DDL does not take as a space")
        at = 0
        while text[at:].strip():
            m = _TOKEN.match(text, at)
            if m is None:
                self._fail(at + len(text[at:]) - len(text[at:].lstrip()), "a character Spark's DDL does not use here")
            assert m is not None
            quoted, word, literal, punct = m.groups()
            kind = "name" if quoted else "word" if word else "string" if literal else "punct"
            value = quoted[1:-1].replace("``", "`") if quoted else (word or literal or punct)
            self.tokens.append((kind, value, m.start(m.lastindex or 0)))
            at = m.end()
        self.i = 0

    def _fail(self, position: int, what: str) -> None:
        msg = f"cannot read the schema {self.text!r} at position {position}: {what}"
        raise DDLError(msg)

    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> tuple[str, str, int]:
        token = self._peek()
        if token is None:
            self._fail(len(self.text), "the schema ends too soon")
        assert token is not None
        self.i += 1
        return token

    def _expect(self, punct: str) -> None:
        kind, value, at = self._take()
        if kind != "punct" or value != punct:
            self._fail(at, f"expected {punct!r}, found {value!r}")

    def _keyword(self, word: str) -> bool:
        token = self._peek()
        if token is not None and token[0] == "word" and token[1].lower() == word:
            self.i += 1
            return True
        return False

    def _int(self) -> int:
        kind, value, at = self._take()
        if kind != "word" or not value.isdigit():
            self._fail(at, f"expected a number, found {value!r}")
        return int(value)

    def fields(self, closing: str | None) -> list[StructField]:
        from pyspark.sql.types import StructField

        out: list[StructField] = []
        token = self._peek()
        if token is None or (token[0] == "punct" and token[1] == closing):
            return out
        while True:
            kind, name, at = self._take()
            if kind not in ("word", "name") or (kind == "word" and name.isdigit()):
                self._fail(at, f"expected a column name, found {name!r}")
            if kind == "word" and _NUMBER_WORD.fullmatch(name):
                self._fail(at, f"expected a column name, found {name!r}, a number to Spark (quote it: `{name}`)")
            token = self._peek()
            if token is not None and token[0] == "punct" and token[1] == ":":
                self.i += 1
            dtype = self.type()
            nullable = True
            if self._keyword("not"):
                if not self._keyword("null"):
                    self._fail(self._pos(), "expected NULL after NOT")
                nullable = False
            metadata: dict[str, Any] = {}
            if self._keyword("comment"):
                kind, literal, at = self._take()
                if kind != "string":
                    self._fail(at, "expected a quoted comment")
                body = literal[1:-1]
                if set(re.findall(r"\\(.)", body)) - {"\\", "'", '"'}:  # Spark's own escapes (\n, \u0041, \%...)
                    self._fail(at, "a comment with an escape other than \\\\, \\' or \\\"")
                metadata["comment"] = re.sub(r"\\(.)", r"\1", body)
            out.append(StructField(name, dtype, nullable, metadata or None))
            token = self._peek()
            if token is None or token[0] != "punct" or token[1] != ",":
                return out
            self.i += 1

    def _pos(self) -> int:
        token = self._peek()
        return len(self.text) if token is None else token[2]

    def type(self) -> DataType:
        from pyspark.sql import types as t

        kind, word, at = self._take()
        name = word.lower()
        if kind != "word":
            self._fail(at, f"expected a type, found {word!r}")
        simple = _simple().get(name)
        if simple is not None:
            return simple()  # type: ignore[no-any-return]
        if name in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            token = self._peek()
            if token is not None and token[0] == "punct" and token[1] == "(":
                self.i += 1
                precision = self._int()
                token = self._peek()
                if token is not None and token[0] == "punct" and token[1] == ",":
                    self.i += 1
                    scale = self._int()
                self._expect(")")
            if not 1 <= precision <= _MAX_PRECISION or not 0 <= scale <= precision:
                self._fail(at, f"decimal({precision}, {scale}): the precision must be 1 to {_MAX_PRECISION} and the "
                               "scale 0 to the precision")
            return t.DecimalType(precision, scale)
        if name in ("varchar", "char"):
            self._expect("(")
            length = self._int()
            if length > _MAX_INT:
                self._fail(at, f"{name}({length}): the length must be at most {_MAX_INT}")
            self._expect(")")
            return t.VarcharType(length) if name == "varchar" else t.CharType(length)
        if name == "array":
            self._expect("<")
            element = self.type()
            self._expect(">")
            return t.ArrayType(element, True)
        if name == "map":
            self._expect("<")
            key = self.type()
            self._expect(",")
            value = self.type()
            self._expect(">")
            return t.MapType(key, value, True)
        if name == "struct":
            self._expect("<")
            inner = self.fields(">")
            self._expect(">")
            return t.StructType(inner)
        self._fail(at, f"unknown or unsupported type {word!r}")
        raise AssertionError  # unreachable: _fail raises


def parse_ddl(text: str) -> StructType:
    """``text`` (Spark DDL of a struct's columns, or those columns as one ``struct<...>`` type, which Spark
    also takes) as a ``StructType``, as ``StructType.fromDDL`` gives it; :class:`DDLError` naming the
    position for what this parser does not read (module notes)."""
    from pyspark.sql.types import StructType

    parser = _Parser(text)
    first = parser._peek()
    if (first is not None and first[0] == "word" and first[1].lower() == "struct" and len(parser.tokens) > 1
            and parser.tokens[1][:2] == ("punct", "<")):
        whole = parser.type()  # the columns written as one struct type, struct<a: int, ...>, as Spark takes them
        fields = list(whole.fields) if isinstance(whole, StructType) else []
    else:
        fields = parser.fields(None)
    if parser.i != len(parser.tokens):
        parser._fail(parser.tokens[parser.i][2], f"unexpected {parser.tokens[parser.i][1]!r}")
    return StructType(fields)


def parse_schema(schema: StructType | str) -> StructType:
    """A DDL string or StructType as a StructType; ConfigError for a DDL that is not a struct of columns.

    With a SparkSession, a DDL string is Spark's parser's to read (with the SQL settings the JVM applies,
    such as ``spark.sql.timestampType``, as ``read_stream`` always did); with none (an ingest process),
    :func:`parse_ddl` reads it, and what it does not read is refused with the position."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql.types import StructType

    st: Any = schema
    if isinstance(schema, str):
        try:
            st = StructType.fromDDL(schema)
        except PySparkRuntimeError:  # no SparkSession: read here
            try:
                st = parse_ddl(schema)
            except DDLError as exc:
                msg = f"{exc} (with no SparkSession, ftlayer reads the DDL itself: {_READS})"
                raise DDLError(msg) from None
        except Exception as exc:  # Spark's parser refused it (a ParseException)
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            msg = f"cannot read the schema {schema!r}: {first.strip()}"
            raise ConfigError(msg) from exc
    if not isinstance(st, StructType):
        msg = f"an ftlayer schema must be a struct of columns; got {schema!r}"
        raise ConfigError(msg)
    return st

"""Read YAML documents from untrusted bytes as the API server's YAML reader does: JSON values, or one `DocumentError`.

`gpt2bench render`, `run` and `validate` read files a user wrote and would `kubectl apply`; kubectl turns each
document into JSON with sigs.k8s.io/yaml (`YAMLToJSON`, go-yaml v2 underneath), the API server the same for a
YAML body. Read here the same way, a file means the same on the local and the cluster paths:

- plain scalars are resolved as go-yaml v2 resolves them (`resolve_plain`): `3e-4` and `1e3` are numbers,
  `017` and `0o17` are 15 (Go's integer syntax, `0x`/`0b` too, `_` ignored), `yes`/`no`/`on`/`off`/`y`/`n`
  are booleans (YAML 1.1's, as sigs.k8s.io/yaml documents: not YAML 1.2's), timestamps and `1:30` stay
  strings; quoted and block scalars are strings;
- mapping keys become JSON's strings as sigs.k8s.io/yaml writes them (`08: x` is the key "8");
- `.inf` and `.nan` are refused: JSON has no such numbers (kubectl: "json: unsupported value");
- a key given twice in a mapping (after resolution, merge keys included) is refused naming the key's path:
  YAML forbids it and the API server's strict reading (`YAMLToJSONStrict`) refuses it; kubectl's client-side
  conversion would silently keep the last (kubernetes/kubernetes#99286);
- a file is a stream of documents separated by `---`, as `kubectl apply -f` takes it; empty documents
  (nothing, only comments, or `null`) are skipped as kubectl skips them.

File-level limits make every file a value or a one-line message, without a traceback, a hang or unbounded
memory:

- size: at most `MAX_FILE_BYTES` (3 MiB, the API server's request limit) are read;
- encoding: UTF-8 (a leading byte-order mark is allowed), as kubectl reads YAML;
- nesting: at most `MAX_DEPTH` levels, aliases included (a GPT2Benchmark is 6 deep);
- aliases: undefined or recursive ones are refused, and so is "excessive aliasing" by go-yaml v2's rule:
  beyond 1,000 decoded nodes and 100 decoded through aliases, at most 99 % may come from aliases (10 % for
  4 million nodes and more), counted per document, so a "billion laughs" file stops here;
- keys that are not scalars are refused (JSON has no place for them);
- tags: only the JSON-compatible core tags (str, int, float, bool, null, map, seq), applied as go-yaml v2
  applies them (`!!str 017` is "017", `!!int 1.5` is refused).

The stream is scanned event by event first (no recursion, no objects built), then composed by PyYAML (libyaml
when available: go-yaml v2 is a port of it, so both parse the same syntax) and turned into JSON values here.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpt2bench.specification.fielderrors import field_path

MAX_FILE_BYTES = 3 * 1024 * 1024
MAX_DEPTH = 100
# yaml.v2 (k8s.io/apimachinery's YAML decoder) decoder.go: allowedAliasRatio
_ALIAS_CHECK_AFTER_DECODES, _ALIAS_CHECK_AFTER_ALIASES = 1000, 100
_ALIAS_RATIO_LOW, _ALIAS_RATIO_HIGH = 400_000, 4_000_000
_CORE = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL, _MAP, _SEQ = (_CORE + name for name in
                                                ("str", "int", "float", "bool", "null", "map", "seq"))
_MERGE = _CORE + "merge"
_CORE_TAGS = {_STR, _INT, _FLOAT, _BOOL, _NULL, _MAP, _SEQ, "!"}
_PLAIN = "gpt2bench:plain"  # a plain scalar without a tag, resolved by `resolve_plain`

# go-yaml v2 resolve.go: the values looked up in a table, then Go's number syntax.
_WORDS: dict[str, tuple[str, Any]] = {
    **{word: (_BOOL, True) for word in ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")},
    **{word: (_BOOL, False) for word in ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")},
    **{word: (_NULL, None) for word in ("", "~", "null", "Null", "NULL")},
    **{word: (_FLOAT, math.nan) for word in (".nan", ".NaN", ".NAN")},
    **{word: (_FLOAT, math.inf) for word in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")},
    **{word: (_FLOAT, -math.inf) for word in ("-.inf", "-.Inf", "-.INF")},
    "<<": (_MERGE, "<<"),
}
_GO_INT = re.compile(r"([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INT64, _UINT64 = 2**63, 2**64


class DocumentError(ValueError):
    """The bytes are not safe YAML documents; the message is one line and names no file. `document` is the
    1-based position in the stream of the document at fault, when it is known."""

    def __init__(self, message: str, document: int | None = None):
        super().__init__(message)
        self.document = document


@dataclass(frozen=True)
class Document:
    """One document of a stream: its 1-based position among all of the stream's documents (empty ones
    counted, as a reader counts the `---`), the line it starts on, and its JSON value."""

    number: int
    line: int
    value: Any


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """PyYAML's parser and composer (libyaml's when available); scalars keep their text: an untagged plain
    scalar is tagged `_PLAIN` for `resolve_plain`, any other untagged one is a string."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            return _PLAIN if implicit[0] else _STR
        return super().resolve(kind, value, implicit)


def read_documents(path: str) -> list[Document]:
    """The non-empty documents of the file at `path`. Raises OSError (unreadable) or DocumentError."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    return parse_documents(data)


def parse_documents(data: bytes) -> list[Document]:
    """The non-empty documents in `data`, in order, as JSON values. Raises DocumentError."""
    text = _text(data)
    number = 0
    try:
        _scan(yaml.parse(text, Loader=_BaseLoader))
        found = []
        for number, node in enumerate(yaml.compose_all(text, Loader=_Loader), start=1):
            value = _Builder().value(node, ())
            if value is not None:
                found.append(Document(number, node.start_mark.line + 1, value))
        return found
    except yaml.YAMLError as exc:
        where = f"document {exc.document}: " if getattr(exc, "document", 1) > 1 else ""
        raise DocumentError(f"not valid YAML: {where}{_one_line(exc)}", getattr(exc, "document", None)) from None
    except _ValueProblem as exc:
        where = f"document {number}: " if number > 1 else ""
        raise DocumentError(f"{where}{exc}", number) from None


def parse_document(data: bytes) -> Any:
    """The one document in `data` (None when it has none); a stream of several is refused. Raises DocumentError."""
    found = parse_documents(data)
    if len(found) > 1:
        raise DocumentError(f"{len(found)} YAML documents ('---'), where one was expected", found[1].number)
    return found[0].value if found else None


def _text(data: bytes) -> str:
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"larger than {MAX_FILE_BYTES} bytes (3 MiB, the API server's request limit)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                            "(save the file as UTF-8)") from None
    return text.removeprefix("\ufeff")


def resolve_plain(text: str) -> tuple[str, Any]:
    """(tag, value) of an untagged plain scalar, as go-yaml v2's `resolve` gives them (resolve.go)."""
    if text in _WORDS:
        return _WORDS[text]
    if text[:1] == ".":
        if _GO_FLOAT.fullmatch(text):
            return _FLOAT, float(text)
    elif text[:1] in "+-0123456789":
        plain = text.replace("_", "")
        integer = _go_int(plain)
        if integer is not None:
            return _INT, integer
        if _GO_FLOAT.fullmatch(plain) and math.isfinite(number := float(plain)):  # Go: out of range is an error
            return _FLOAT, number
    return _STR, text


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64), else ParseUint(text, 0, 64) (which takes no sign), else None."""
    match = _GO_INT.fullmatch(text)
    if not match or len(text) > 80:  # no int64/uint64 needs more digits (binary ones included)
        return None
    sign, digits = match.groups()
    prefix = digits[:2].lower()
    base = {"0x": 16, "0o": 8, "0b": 2}.get(prefix)
    value = int(digits[2:], base) if base else int(digits, 8 if digits.startswith("0") else 10)
    value = -value if sign == "-" else value
    if -_INT64 <= value < _INT64 or (not sign and value < _UINT64):
        return value
    return None


class _ValueProblem(ValueError):
    """A document that parses but holds no JSON value; the message names the line and the field."""


def _problem(node: Any, path: tuple | None, message: str) -> _ValueProblem:
    """`line 7, column 3 (spec.training.lr): message`; a None path is named by the message itself."""
    mark = node.start_mark
    where = f" ({field_path(path)})" if path else ""
    return _ValueProblem(f"line {mark.line + 1}, column {mark.column + 1}{where}: {message}")


@dataclass
class _Builder:
    """Turns one composed document into JSON values as sigs.k8s.io/yaml's YAMLToJSONStrict does."""

    done: dict[int, Any] = field(default_factory=dict)  # aliased nodes are built once

    def value(self, node: Any, path: tuple) -> Any:
        if id(node) not in self.done:
            if isinstance(node, yaml.ScalarNode):
                self.done[id(node)] = self.scalar(node, path)
            elif isinstance(node, yaml.SequenceNode):
                if node.tag != _SEQ:
                    raise _problem(node, path, f"a list cannot be {_short(node.tag)}")
                self.done[id(node)] = [self.value(item, (*path, i)) for i, item in enumerate(node.value)]
            else:
                self.done[id(node)] = self.mapping(node, path)
        return self.done[id(node)]

    def scalar(self, node: Any, path: tuple) -> Any:
        tag, value = _STR, node.value
        if node.tag not in (_STR, "!"):
            tag, value = resolve_plain(node.value)
            if node.tag == _FLOAT and tag == _INT:  # as go-yaml v2: `!!float 1` is 1.0
                tag, value = _FLOAT, float(value)
            elif node.tag not in (_PLAIN, tag):
                raise _problem(node, path, f"cannot read {_short(tag)} `{node.value}` as {_short(node.tag)}")
        if tag == _FLOAT:
            if not math.isfinite(value):
                raise _problem(node, path, f"{node.value} is not a number JSON can hold (kubectl refuses it too)")
            return float(value)
        if tag == _MERGE:
            raise _problem(node, path, "a merge key (<<) must be a mapping's key")
        return value

    def mapping(self, node: Any, path: tuple) -> dict[str, Any]:
        """Keys as JSON strings; merged mappings (`<<: *base`) first; any key set twice is refused."""
        if node.tag != _MAP:
            raise _problem(node, path, f"a mapping cannot be {_short(node.tag)}")
        result: dict[str, Any] = {}
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == _PLAIN and key_node.value == "<<":
                for merged, merged_lines in self.merged(value_node, path):
                    for key, value in merged.items():
                        self.put(result, lines, key, value, merged_lines[key], value_node, path)
                continue
            key = self.key(key_node, path)
            self.put(result, lines, key, self.value(value_node, (*path, key)), key_node.start_mark.line + 1,
                     key_node, path)
        return result

    def merged(self, node: Any, path: tuple) -> list[tuple[dict[str, Any], dict[str, int]]]:
        """A merge key's mappings (one, or a list of them), each with the lines of its keys."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items or not all(isinstance(item, yaml.MappingNode) for item in items):
            raise _problem(node, path, "a merge key (<<) takes a mapping or a list of mappings")
        return [(self.value(item, path), {self.key(k, path): k.start_mark.line + 1 for k, _ in item.value
                                          if not (k.tag == _PLAIN and k.value == "<<")}) for item in items]

    def key(self, node: Any, path: tuple) -> str:
        """A key as sigs.k8s.io/yaml writes it into JSON: strings as they are, numbers and booleans as text."""
        if not isinstance(node, yaml.ScalarNode):
            raise _problem(node, path, "a mapping key must be a plain value, not a list or a mapping")
        value = self.scalar(node, path)
        if value is None:
            raise _problem(node, path, "a mapping key cannot be null")
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return _go_float32_text(value)
        return str(value)

    @staticmethod
    def put(result: dict, lines: dict, key: str, value: Any, line: int, node: Any, path: tuple) -> None:
        if key in result:
            raise _problem(node, None, f"{field_path((*path, key))} is given twice (lines {lines[key]} and {line}): "
                                       "YAML forbids a key twice in a mapping, and the API server refuses it")
        result[key], lines[key] = value, line


def _short(tag: str) -> str:
    return {_PLAIN: "a plain value", "!": "!"}.get(tag, tag.replace(_CORE, "!!"))


def _go_float32_text(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 32), as sigs.k8s.io/yaml writes a number key: the fewest digits that
    read back as the same float32, in %e form below 1e-4 and from 1e6 (`1e+06`, `1.5e-05`), else plain."""
    single = struct.unpack("f", struct.pack("f", value))[0]
    text = ""
    for precision in range(9):
        text = f"{single:.{precision}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            break
    mantissa, exponent = text.split("e")
    sign, digits, power = "-" if mantissa[0] == "-" else "", mantissa.lstrip("-").replace(".", ""), int(exponent)
    if power < -4 or power >= 6:
        rest = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{rest}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if power < 0:
        return f"{sign}0.{'0' * (-power - 1)}{digits}"
    whole, fraction = digits[:power + 1].ljust(power + 1, "0"), digits[power + 1:]
    return f"{sign}{whole}.{fraction}" if fraction else f"{sign}{whole}"


def _one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's message without its multi-line context: `line 3, column 5: found undefined alias 'x'`."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join((exc.problem or exc.context or "").split())
        if exc.context and exc.problem:
            problem += f" ({' '.join(exc.context.split())})"
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem
    if isinstance(exc, yaml.reader.ReaderError):
        return f"offset {exc.position}: {' '.join(exc.reason.split())}"
    return " ".join(str(exc).split())


@dataclass
class _Node:
    """An open mapping or sequence while scanning: what it will count once it ends."""

    mapping: bool
    anchor: str | None
    decodes: int = 1
    height: int = 1
    expect_key: bool = True


@dataclass
class _Counts:
    real: int = 0  # nodes written in the document
    aliased: int = 0  # nodes decoded again through aliases

    def check(self, mark: Any) -> None:
        total = self.real + self.aliased
        if self.aliased > _ALIAS_CHECK_AFTER_ALIASES and total > _ALIAS_CHECK_AFTER_DECODES \
                and self.aliased / total > _allowed_alias_ratio(total):
            raise _marked(mark, f"excessive aliasing: aliases expand to {self.aliased} of {total} nodes "
                                "(kubectl refuses such files too)")


def _allowed_alias_ratio(decodes: int) -> float:
    if decodes <= _ALIAS_RATIO_LOW:
        return 0.99
    if decodes >= _ALIAS_RATIO_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decodes - _ALIAS_RATIO_LOW) / (_ALIAS_RATIO_HIGH - _ALIAS_RATIO_LOW)


def _marked(mark: Any, problem: str) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(problem=problem, problem_mark=mark)


def _scan(events: Any) -> None:
    """Check the limits above on the event stream, document by document (anchors and counts are per
    document, as in YAML and go-yaml); a failure carries the document's number as `document`."""
    stack: list[_Node] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor → (decodes, height) of its node, once it is complete
    counts = _Counts()
    documents = 0
    try:
        for event in events:
            mark = event.start_mark
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                anchors, counts = {}, _Counts()
            elif isinstance(event, yaml.AliasEvent):
                if any(node.anchor == event.anchor for node in stack):
                    raise _marked(mark, f"alias *{event.anchor} refers to a node that contains it (recursive alias)")
                if event.anchor not in anchors:
                    raise _marked(mark, f"found undefined alias *{event.anchor}")
                _key(stack, False, mark)
                decodes, height = anchors[event.anchor]
                counts.aliased += decodes
                _add(stack, decodes, height, mark)
                counts.check(mark)
            elif isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
                _tag(event, mark)
                _key(stack, isinstance(event, yaml.ScalarEvent), mark)
                counts.real += 1
                if isinstance(event, yaml.ScalarEvent):
                    if event.anchor:
                        anchors[event.anchor] = (1, 1)
                    _add(stack, 1, 1, mark)
                else:
                    if len(stack) + 1 > MAX_DEPTH:
                        raise _marked(mark, f"nested more than {MAX_DEPTH} levels deep")
                    stack.append(_Node(isinstance(event, yaml.MappingStartEvent), event.anchor))
            elif isinstance(event, yaml.CollectionEndEvent):
                node = stack.pop()
                if node.anchor:
                    anchors[node.anchor] = (node.decodes, node.height)
                _add(stack, node.decodes, node.height, mark)
    except yaml.YAMLError as exc:
        exc.document = max(documents, 1)  # type: ignore[attr-defined]
        raise


def _tag(event: Any, mark: Any) -> None:
    if event.tag is not None and event.tag not in _CORE_TAGS:
        tag = event.tag.replace(_CORE, "!!")
        raise _marked(mark, f"YAML tag {tag} is not allowed: a GPT2Benchmark holds only mappings, lists, "
                            "strings, numbers, booleans and null")


def _key(stack: list[_Node], scalar: bool, mark: Any) -> None:
    """A node inside a mapping alternates key, value; keys must be scalars."""
    if not stack or not stack[-1].mapping:
        return
    node = stack[-1]
    if node.expect_key and not scalar:
        raise _marked(mark, "a mapping key must be a plain value, not a list, a mapping or an alias")
    node.expect_key = not node.expect_key


def _add(stack: list[_Node], decodes: int, height: int, mark: Any) -> None:
    """Count a complete node into its parent; the nesting it brings (through aliases too) is bounded."""
    if len(stack) + height > MAX_DEPTH:
        raise _marked(mark, f"nested more than {MAX_DEPTH} levels deep (aliases included)")
    if stack:
        stack[-1].decodes += decodes
        stack[-1].height = max(stack[-1].height, height + 1)

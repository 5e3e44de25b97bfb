"""Read one YAML document from untrusted bytes: any input ends in a value or in one `DocumentError`.

`gpt2bench render` and `gpt2bench run` read files a user wrote; these limits make every file either a
Python value (mappings, lists, strings, numbers, booleans, null) or a one-line message, without a
traceback, a hang or unbounded memory:

- size: at most `MAX_FILE_BYTES` (3 MiB, the API server's request limit) are read;
- encoding: UTF-8 (a leading byte-order mark is allowed), as kubectl reads YAML;
- one document: a file holds one GPT2Benchmark (no `---` stream of several);
- nesting: at most `MAX_DEPTH` levels, aliases included (a GPT2Benchmark is 6 deep; Python's parsers and
  validators recurse, so a deeper file is refused before it is built);
- aliases: undefined or recursive ones are refused, and so is "excessive aliasing" by the rule of yaml.v2,
  kubectl's YAML decoder: beyond 1,000 decoded nodes and 100 decoded through aliases, at most 99 % may
  come from aliases (10 % for 4 million nodes and more), so a "billion laughs" file stops here;
- duplicate keys in a mapping and keys that are not scalars are refused (YAML forbids the first; JSON has
  no place for the second);
- tags: only the JSON-compatible core tags (str, int, float, bool, null, map, seq); timestamps stay
  strings, as kubectl keeps them.

The document is scanned event by event first (no recursion, no objects built), then loaded with
PyYAML's safe loader, which alone never executes tags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

MAX_FILE_BYTES = 3 * 1024 * 1024
MAX_DEPTH = 100
# yaml.v2 (k8s.io/apimachinery's YAML decoder) decoder.go: allowedAliasRatio
_ALIAS_CHECK_AFTER_DECODES, _ALIAS_CHECK_AFTER_ALIASES = 1000, 100
_ALIAS_RATIO_LOW, _ALIAS_RATIO_HIGH = 400_000, 4_000_000
_CORE_TAGS = {f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq")} | {"!"}
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_KEY = "<<"


class DocumentError(ValueError):
    """The bytes are not one safe YAML document; the message is one line and names no file."""


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader (libyaml's when available) with timestamps left as strings."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def read_document(path: str) -> Any:
    """The one YAML document of the file at `path`. Raises OSError (unreadable) or DocumentError."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    return parse_document(data)


def parse_document(data: bytes) -> Any:
    """The one YAML document in `data` (None for an empty one). Raises DocumentError."""
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"larger than {MAX_FILE_BYTES} bytes (3 MiB, the API server's request limit)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                            "(save the file as UTF-8)") from None
    text = text.removeprefix("\ufeff")
    try:
        if _scan(yaml.parse(text, Loader=_BaseLoader)) == 0:
            return None
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise DocumentError(f"not valid YAML: {_one_line(exc)}") from None
    except Exception as exc:  # PyYAML's constructors raise what they meet (`!!int ` → IndexError)
        raise DocumentError(f"not valid YAML: {' '.join(str(exc).split()) or type(exc).__name__}") from None


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
    keys: set[str] = field(default_factory=set)


@dataclass
class _Counts:
    real: int = 0  # nodes written in the file
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


def _scan(events: Any) -> int:
    """Check the limits above on the event stream; return how many documents it holds (0 or 1)."""
    stack: list[_Node] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor → (decodes, height) of its node, once it is complete
    counts = _Counts()
    documents = 0
    for event in events:
        mark = event.start_mark
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise _marked(mark, "a second YAML document ('---'): a file holds one GPT2Benchmark")
        elif isinstance(event, yaml.AliasEvent):
            if any(node.anchor == event.anchor for node in stack):
                raise _marked(mark, f"alias *{event.anchor} refers to a node that contains it (recursive alias)")
            if event.anchor not in anchors:
                raise _marked(mark, f"found undefined alias *{event.anchor}")
            _key(stack, None, mark)
            decodes, height = anchors[event.anchor]
            counts.aliased += decodes
            _add(stack, decodes, height, mark)
            counts.check(mark)
        elif isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
            _tag(event, mark)
            _key(stack, event.value if isinstance(event, yaml.ScalarEvent) else None, mark)
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
    return documents


def _tag(event: Any, mark: Any) -> None:
    if event.tag is not None and event.tag not in _CORE_TAGS:
        tag = event.tag.replace("tag:yaml.org,2002:", "!!")
        raise _marked(mark, f"YAML tag {tag} is not allowed: a GPT2Benchmark holds only mappings, lists, "
                            "strings, numbers, booleans and null")


def _key(stack: list[_Node], scalar: str | None, mark: Any) -> None:
    """A node inside a mapping alternates key, value; keys must be scalars, each given once."""
    if not stack or not stack[-1].mapping:
        return
    node = stack[-1]
    if node.expect_key:
        if scalar is None:
            raise _marked(mark, "a mapping key must be a plain value, not a list, a mapping or an alias")
        if scalar in node.keys and scalar != _MERGE_KEY:
            raise _marked(mark, f"key {scalar!r} is given twice in the same mapping")
        node.keys.add(scalar)
    node.expect_key = not node.expect_key


def _add(stack: list[_Node], decodes: int, height: int, mark: Any) -> None:
    """Count a complete node into its parent; the nesting it brings (through aliases too) is bounded."""
    if len(stack) + height > MAX_DEPTH:
        raise _marked(mark, f"nested more than {MAX_DEPTH} levels deep (aliases included)")
    if stack:
        stack[-1].decodes += decodes
        stack[-1].height = max(stack[-1].height, height + 1)

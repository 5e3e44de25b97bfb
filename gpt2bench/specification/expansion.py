"""The kubelet's `$(VAR)` expansion of a container's env values, command and args, and its escape.

The rules are those of k8s.io/kubernetes `third_party/forked/golang/expansion` (tests/test_expansion.py runs
its test table):

- `$(NAME)` becomes NAME's value when NAME is defined; otherwise it stays as written. NAME is everything up to
  the first `)`, whatever it holds;
- `$$` becomes `$` (the escape), so `$$(NAME)` is the text `$(NAME)`;
- any other `$` stays, with the character after it (`$HOME`, `${X}`, `$(` without a closing `)`, a `$` at the end).

A string the user wrote (a data source, a pretrained path) goes into the rendered job through `escape`, so that
the kubelet (and the local runner, which expands with this same function) gives the trainer the string as written,
`$(X)` and `$$` included. The renderer's own references (`--output $(GPT2BENCH_OUTPUT_DIR)`) are left unescaped.
"""

from __future__ import annotations

from collections.abc import Mapping

OPERATOR, OPENER, CLOSER = "$", "(", ")"


def expand(text: str, variables: Mapping[str, str]) -> str:
    """`text` with its references replaced by the kubelet's rules (module docstring)."""
    out: list[str] = []
    at, end = 0, len(text)
    while at < end:
        dollar = text.find(OPERATOR, at)
        if dollar < 0 or dollar + 1 == end:  # no operator left, or one at the very end: kept
            out.append(text[at:])
            break
        out.append(text[at:dollar])
        after = text[dollar + 1]
        if after == OPERATOR:  # the escape
            out.append(OPERATOR)
            at = dollar + 2
        elif after == OPENER and (close := text.find(CLOSER, dollar + 2)) >= 0:
            name = text[dollar + 2 : close]
            out.append(variables[name] if name in variables else text[dollar : close + 1])
            at = close + 1
        else:  # `$x`, or `$(` never closed: kept, and the character after it is not read again
            out.append(OPERATOR + after)
            at = dollar + 2
    return "".join(out)


def escape(text: str) -> str:
    """`text` such that `expand(escape(text), anything) == text`: every `$` doubled."""
    return text.replace(OPERATOR, OPERATOR * 2)

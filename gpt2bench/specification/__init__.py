"""The spec side: what a GPT2Benchmark may say, and how a file becomes one.

`model` (the pydantic models: the one source of truth for the API), `values` (their base model, value types
and CEL rules), `kubesyntax` (names, labels, quantities as the API server accepts them), `documents` (YAML
read as the API server reads it), `fielderrors` (errors naming the field), `validation` (the one validation
every path shares), `crd` (the CRD generated from the models) and `validate_cli` (`gpt2bench validate`).
"""

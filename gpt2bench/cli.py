"""`gpt2bench` console script: one sub-command per stage of the data flow.

Each sub-command owns its argument parser in its own module and is imported lazily, so that
`gpt2bench render` does not pay for importing torch.
"""

from __future__ import annotations

import importlib
import os
import sys

from gpt2bench.conventions import FORKED_COMMANDS, FORKSERVER_ENV

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("gpt2bench.local.cli", "run a GPT2Benchmark YAML on this machine, no cluster needed"),
    "render": ("gpt2bench.render.cli", "print the Kubeflow jobs a GPT2Benchmark YAML becomes"),
    "validate": ("gpt2bench.specification.validate_cli", "check every GPT2Benchmark of a YAML file as the API server would"),
    "report": ("gpt2bench.report.cli", "rebuild the recommendation, tables and plots (from a folder or a cluster)"),
    "compare": ("gpt2bench.report.compare", "put two benchmarks' results side by side"),
    "train": ("gpt2bench.trainer.cli", "train GPT-2 under one strategy (runs inside every job replica)"),
    "operator": ("gpt2bench.controller.main", "run the kopf operator that reconciles GPT2Benchmarks"),
    "crd": ("gpt2bench.specification.crd", "print or write the CRD generated from the spec model"),
    "launch": ("gpt2bench.launch", "run the MPIJob launcher's mpirun and keep the trainer's summary"),
}


def usage() -> str:
    lines = ["usage: gpt2bench COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `gpt2bench COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    own_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        from gpt2bench import __version__

        print(__version__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"gpt2bench: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if own_command_line and command in FORKED_COMMANDS and FORKSERVER_ENV in os.environ:
        from gpt2bench.local.forkclient import hand_over

        hand_over([sys.argv[0], *argv])  # returns only when the server cannot take it
    module = importlib.import_module(COMMANDS[command][0])
    code = int(module.main(rest) or 0)
    if getattr(module, "EXIT_WITHOUT_DESTRUCTORS", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code

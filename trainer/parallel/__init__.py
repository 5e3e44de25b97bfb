"""Strategy registry: name (as on the CLI and in the CR) -> Parallelism subclass, imported lazily; the names and
classes are the strategies' table's (gpt2bench.strategies).

Lazy so that importing the trainer never imports horovod (absent on many machines) or RPC code.
"""

from __future__ import annotations

import importlib

from gpt2bench.strategies import STRATEGY_TABLE

from .base import Parallelism

# strategy name -> "module:Class" under gpt2bench.trainer.parallel: the strategies' table (gpt2bench.strategies)
STRATEGIES: dict[str, str] = {strategy.name: strategy.trainer for strategy in STRATEGY_TABLE}


def strategy_class(name: str) -> type[Parallelism]:
    """The class for a strategy name; ImportError names what is missing (e.g. horovod)."""
    if name not in STRATEGIES:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    module_name, class_name = STRATEGIES[name].split(":")
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, class_name)


__all__ = ["STRATEGIES", "Parallelism", "strategy_class"]

"""gpt2bench: which data-parallel strategy, precision and scale should we train GPT-2 with?

Data flow: spec -> plan -> render -> run (cluster or local) -> train -> metrics -> collect -> report.
"""

__version__ = "0.1.0"

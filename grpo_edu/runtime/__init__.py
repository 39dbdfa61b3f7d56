"""What every run stands on, whatever it trains: processes, files, kernels, precision, the metrics log.

    distributed.py  one run on N processes: ranks, process groups, a step's prompts sharded
                    (a group never split), DDP/FSDP2 wrapping, whole weights
    durable.py      fsync and atomic replacement of small files (checkpoints and the run log)
    numerics.py     the pinned floating-point kernels that make runs reproducible anywhere
    precision.py    the forward passes' precision: float32, or bf16 autocast (config key precision)
    registry.py     registrar: named families of functions, filled by a decorator (the variants)
    runlog.py       metrics.jsonl, one line per step: the only code that touches it
    settings.py     a config key as a dataclass field: its doc, default and rules (config sections)

Imports nothing else of grpo_edu.
"""

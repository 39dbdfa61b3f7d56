"""The doctor: GRPO's failure modes recognised from a run's metrics, during the run or after it.

    diagnose.py  each failure mode a detector over the metrics history (and the run's config):
                 its evidence and the advice; LiveDoctor, which the trainer asks after every step

`grpo-edu doctor RUN_DIR` reads a finished (or stopped) run with it; `grpo-edu doctor --gpu`,
the check of a GPU machine, is a command of its own (grpo_edu.commands.doctor).

Imports grpo_edu.runtime only (the metrics log): a run's record is all it reads.
"""

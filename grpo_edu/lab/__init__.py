"""The failure lab's bugs and the doctor that names a failure from a run's metrics.

    faults.py    deliberate bugs a run can be given (never a config key): chapter 7
    diagnose.py  `grpo-edu doctor RUN_DIR`: GRPO's failure modes recognised from metrics,
                 after a run or live during it

The lab's runs, which train, are grpo_edu.book.lab. Imports only grpo_edu.runtime.
"""

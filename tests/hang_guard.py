"""The one timeout the suite puts on a subprocess: a guard against a hang, never a deadline.

A reader's laptop is often slower or busier than CI (a 2-core machine running other work
took 4x CI's time on the suite), so no test may fail because a run was slow. Every
subprocess the suite starts gets HANG_SECONDS, far above any plausible run: the longest,
the chapters under other kernels (tests/test_numerics.py), takes about 7 minutes on an idle
2-core machine; a hang is a process that makes no progress at all, and is caught all the
same, hours later rather than never.
"""

HANG_SECONDS = 3 * 3600

"""`python -m grpo_edu ...` is `grpo-edu ...`; torchrun starts it so:

    torchrun --standalone --nproc-per-node 2 -m grpo_edu train --config configs/cpu-tiny.toml

A process that torchrun started leaves without the interpreter's teardown, once the command has
returned (and so left the process group) and the exit handlers have run: under CPU contention a
rank tearing down c10d's C++ threads at exit has aborted now and then ("terminate called without
an active exception", SIGABRT) after a run whose numbers were right. A run that fails still fails:
its exit code is kept, and an exception is printed first.
"""

import atexit
import os
import sys

from grpo_edu.commands.cli import main

if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    try:
        code = main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()   # what the interpreter would run: stopping a started server, say
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
else:
    sys.exit(main())

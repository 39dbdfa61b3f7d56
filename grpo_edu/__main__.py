"""`python -m grpo_edu ...` is `grpo-edu ...`; torchrun starts it so:

    torchrun --standalone --nproc-per-node 2 -m grpo_edu train --config configs/cpu-tiny.toml
"""

import sys

from grpo_edu.commands.cli import main

sys.exit(main())

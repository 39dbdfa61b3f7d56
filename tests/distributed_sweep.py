"""Train several configs in one process group: the 2-process equality tests' driver.

    python tests/distributed_sweep.py RUNS.json                    # one process
    torchrun --standalone --nproc-per-node 2 tests/distributed_sweep.py RUNS.json

RUNS.json: a list of {"output_dir": ..., "overrides": ["key=value", ...], optional
"stop_after": n, "resume": run_dir, "per_rank_normaliser": true}. One launch trains them
all (torchrun's start-up is paid once). per_rank_normaliser replaces the trainer's global
loss denominators by each rank's own counts, averaged over ranks as DDP averages
gradients: the mistake tests/test_distributed.py shows breaking the equality.
"""

import json
import os
import sys

import torch

from grpo_edu.runtime import distributed
from grpo_edu.training import plan as planning, trainer
from grpo_edu.config import TrainConfig


def per_rank_totals(plan, k, loss_type, mask_truncated=False):
    """Each rank's own completions and tokens in mini-batch k, times the world size: with the
    trainer's x N on the loss and the ranks' gradient average, the mean of per-rank losses."""
    width = plan.owned.stop - plan.owned.start
    world_size = len(plan.rewards) // width
    lengths = (plan.lengths * plan.finished if mask_truncated else plan.lengths)[plan.owned]
    keep = plan.local_groups(k)
    if loss_type == "dapo":
        items = int(lengths[plan.trained_groups()].sum()) / len(plan.mini_batches)
    else:
        items = float(lengths[keep].sum())
    # A rank with nothing in the mini-batch runs only zero-weight padding: any positive count does.
    return planning.LossTotals(num_completions=max(1, int(keep.sum()) * plan.group_size) * world_size,
                               num_items=max(items, 1.0) * world_size)


def main() -> None:
    runs = json.loads(open(sys.argv[1]).read())
    global_totals = planning.Plan.totals
    for run in runs:
        planning.Plan.totals = per_rank_totals if run.get("per_rank_normaliser") else global_totals
        config = TrainConfig.from_toml(None, run["overrides"] + [f"output_dir={json.dumps(run['output_dir'])}"])
        trainer.train(config, resume=run.get("resume"), stop_after=run.get("stop_after"), log=lambda _: None)
    distributed.close_world(distributed.init_world(config.run.device))


if __name__ == "__main__":
    main()
    # Every run is written and the process group is gone: leave without the interpreter's teardown.
    # Under CPU contention a rank of this driver has aborted now and then with "terminate called
    # without an active exception" (SIGABRT), the signature of a C++ thread destroyed unjoined, as at
    # exit; the same tests pass alone. Whether it was the exit is not proven: if a rank aborts
    # mid-run, this line does not hide it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

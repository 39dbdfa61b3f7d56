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
import sys

import torch

from grpo_edu import distributed, trainer
from grpo_edu.config import TrainConfig


def per_rank_totals(plan, config, k):
    """Each rank's own completions and tokens in mini-batch k (x world size, which with the
    trainer's x N on the loss and the ranks' gradient average gives the mean of per-rank losses)."""
    keep = plan.local_groups(k)
    owned = slice(plan.owned.start, plan.owned.stop)
    lengths = plan.lengths[owned][keep]
    size = (plan.owned.stop - plan.owned.start) and (len(plan.rewards) // (plan.owned.stop - plan.owned.start))
    if config.loss_type == "dapo":
        trained = torch.zeros(plan.owned.stop - plan.owned.start, dtype=torch.bool)
        for j in range(config.num_mini_batches):
            trained |= plan.local_groups(j)
        items = int(plan.lengths[owned][trained].sum()) / config.num_mini_batches
    else:
        items = float(lengths.sum())
    return trainer.LossTotals(num_completions=max(1, int(keep.sum()) * plan.group_size) * size,
                              num_items=max(items, 1.0) * size)


def main() -> None:
    runs = json.loads(open(sys.argv[1]).read())
    global_totals = trainer.Plan.totals
    for run in runs:
        trainer.Plan.totals = per_rank_totals if run.get("per_rank_normaliser") else global_totals
        config = TrainConfig.from_toml(None, run["overrides"] + [f"output_dir={json.dumps(run['output_dir'])}"])
        trainer.train(config, resume=run.get("resume"), stop_after=run.get("stop_after"), log=lambda _: None)
    distributed.close_world(distributed.init_world(config.device))


if __name__ == "__main__":
    main()

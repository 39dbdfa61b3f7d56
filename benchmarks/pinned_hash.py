"""The sha256 of a pinned run's final weights: did a change of the code change a number?

    env $(python -m grpo_edu.runtime.numerics) python benchmarks/pinned_hash.py [--steps 200] [--set key=value ...]

Trains the default config (TrainConfig's defaults, plus --set overrides) for --steps steps, no
checkpoints, one evaluation at the end, and prints the final greedy accuracy and the sha256 of the
final weights (every tensor of the state dict, by name). Run it before and after a refactor under the
pinned kernels: equal hashes mean the change computes the same run bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile


def weights_sha256(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps: expected at least 1, got {args.steps}")
    from grpo_edu.config import TrainConfig
    from grpo_edu.training import trainer

    with tempfile.TemporaryDirectory() as directory:
        config = TrainConfig.from_toml(None, [f"steps={args.steps}", f"output_dir={directory!r}",
                                              f"eval_every={args.steps}", "checkpoint_every=0", "progress=false",
                                              *args.set])
        result = trainer.train(config, log=lambda _: None)
    accuracy = result.history[-1].get("eval/greedy_accuracy")
    print(f"{args.steps} steps: final greedy accuracy {accuracy}, weights sha256 {weights_sha256(result.policy)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

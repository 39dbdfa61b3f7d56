"""A short GRPO run and NumPy's kernels, fingerprinted: what tests/test_numerics.py runs
under different kernel environments (python tests/numerics_probe.py OUTPUT_DIR).

Prints one JSON line: the kernels torch dispatched to, the SHA-256 of the trained
policy's weights, and of NumPy results (OpenBLAS products, SIMD ufunc loops). Equal
fingerprints mean bitwise-equal results.
"""

import hashlib
import json
import sys

import numpy as np
import torch

from grpo_edu.training import trainer
from grpo_edu.config import TrainConfig

# An on-policy run (one optimizer step per rollout) of the committed starting policy,
# through the fused engine: sampling, scoring, reference log-probs and AdamW, 3 steps.
PROBE_RUN = ["prompts_per_step=8", "num_generations=4", "max_completion_length=16", "steps=3",
             "eval_every=1000", "eval_size=16", "checkpoint_every=0", "progress=false", "threads=2"]


def weights_digest(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def numpy_digest() -> str:
    """OpenBLAS (a matrix and a dot product) and NumPy's own SIMD loops (exp, log, tanh,
    float32 sums), the operations the NumPy chapters use."""
    rng = np.random.default_rng(0)
    a, x = rng.standard_normal((96, 96)), rng.standard_normal(4099)
    x32 = x.astype(np.float32)
    results = [a @ a, np.float64(x @ x), np.exp(x), np.log(np.abs(x)), np.tanh(x),
               np.exp(x32), np.log(np.abs(x32)), x32.sum(), x.std()]
    return hashlib.sha256(b"".join(np.asarray(r).tobytes() for r in results)).hexdigest()


def main(output_dir: str) -> None:
    config = TrainConfig.from_toml(None, PROBE_RUN + [f"output_dir='{output_dir}'"])
    result = trainer.train(config, log=lambda _: None)
    print(json.dumps({"torch_capability": torch.backends.cpu.get_cpu_capability(),
                      "weights": weights_digest(result.policy), "numpy": numpy_digest()}))


if __name__ == "__main__":
    main(sys.argv[1])

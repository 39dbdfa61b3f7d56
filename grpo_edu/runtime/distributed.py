"""One training run on N processes: the ranks, what each owns, and how they agree.

    torchrun --standalone --nproc-per-node N -m grpo_edu train --config ...

runs the trainer in N processes (ranks). Without torchrun (no WORLD_SIZE in the
environment) there is one rank and nothing here communicates. The backend is
the device's: gloo on the CPU, nccl on CUDA (one GPU per rank, cuda:LOCAL_RANK).

What makes N ranks train exactly what one process trains:

- Whole prompts per rank. Every rank draws the same prompt list from the shared
  seed and takes its contiguous slice (`World.shard`): rank r owns prompts
  r B/N ... (r + 1) B/N - 1 and all G completions of each. A group never crosses
  ranks, so its advantages need no communication, and prompts_per_step not
  divisible by N is an error.
- The random numbers sampling uses are drawn for the whole batch, on every rank
  alike, and each rank takes its rows (the fused engine's uniforms table): the
  rollout does not depend on N, and every rank's torch RNG stays in step.
- The batch-level numbers are global: the rewards (B, G) are gathered, so the
  advantages (any advantage_fn, batch std included), the mini-batch plan and
  the zero-std filter are computed from all B prompts on every rank; the
  loss's denominators (completions and tokens of a mini-batch, dapo's tokens per
  optimizer step) come from the gathered completion lengths. Each rank's loss is
  then its part of the 1-process loss (loss.py: parts add up), times N, because
  DDP and FSDP2 average gradients over ranks: the averaged gradient is the sum of
  the parts, the 1-process gradient.
- Every rank runs the same number of micro-batches per optimizer step (a rank
  with fewer rows runs a zero-weight one), so the collectives line up.

Parallelism: "ddp" replicates the policy and all-reduces gradients (torch DDP);
"fsdp2" shards parameters, gradients and AdamW's state 1/N per rank (torch's
`fully_shard`) and gathers the parameters for each forward. Either way
`LogprobModel` is what gets wrapped: a module whose forward is the completion
log-probs, so the fused CPU path and transformers' forward both run inside the
wrapper's hooks.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

PARALLELISM = ("ddp", "fsdp2")
DEVICES = ("auto", "cpu", "cuda")   # config key device (resolve_device)


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank of size, and its device."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    # None: the collectives below run in the default process group, on `device`. A side
    # group (side_world): they run in it instead, on CPU tensors (gloo), so that a second
    # thread's collectives never interleave with the main thread's in one group.
    group: object = field(default=None, compare=False, repr=False)

    @property
    def _comm_device(self) -> torch.device:
        return torch.device("cpu") if self.group is not None else self.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the log, plots, summary and checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def shard(self, n: int, what: str = "prompts_per_step") -> slice:
        """This rank's contiguous share of n whole items (prompts): n / size of them."""
        if n % self.size:
            raise ValueError(f"config key {what!r} ({n}) must be divisible by the number of processes "
                             f"({self.size}): each process owns whole prompts, all G completions of each")
        per_rank = n // self.size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def split(self, n: int) -> slice:
        """A near-equal contiguous share of n items that need not divide (evaluation problems)."""
        bounds = [n * r // self.size for r in range(self.size + 1)]
        return slice(bounds[self.rank], bounds[self.rank + 1])

    # ------------------------------------------------------------------ collectives
    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor of the same shape, concatenated along dim 0 in rank order."""
        if not self.distributed:
            return tensor
        local = tensor.to(self._comm_device).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts).to(tensor.device)

    def gather_objects(self, values: list) -> list:
        """Every rank's list (any lengths), joined in rank order."""
        if not self.distributed:
            return list(values)
        parts: list = [None] * self.size
        dist.all_gather_object(parts, list(values), group=self.group)
        return [value for part in parts for value in part]

    def reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """The elementwise sum, min or max over ranks (a new tensor)."""
        if not self.distributed:
            return tensor.clone()
        result = tensor.to(self._comm_device).clone()
        dist.all_reduce(result, {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
                                 "max": dist.ReduceOp.MAX}[op], group=self.group)
        return result.to(tensor.device)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)


def side_world(world: World) -> World:
    """The same ranks in a process group of their own (gloo, CPU tensors), for collectives
    that a second thread runs while the main thread runs others (grpo_edu.training.asynchronous: the
    background sampler gathers each rollout's rewards while the update all-reduces gradients).
    Two threads that share one group could enter their collectives in different orders on
    different ranks and hang; each group keeps its own order. Every rank must call this, at
    the same point (creating a group is itself collective). A world of one is returned as it is."""
    if not world.distributed:
        return world
    return replace(world, group=dist.new_group(backend="gloo"))


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """config.run.device -> the torch device of a rank: "auto" is CUDA where torch sees a GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("config key 'device' is 'cuda', but torch sees no GPU (torch.cuda.is_available() "
                             "is False: no GPU, or a CPU build of torch); use device = 'cpu' or 'auto'")
        return torch.device("cuda", local_rank)
    if device != "cpu":
        raise ValueError(f"config key 'device' must be one of ('auto', 'cpu', 'cuda'), got {device!r}")
    return torch.device("cpu")


def init_world(device: str = "auto") -> World:
    """The World of this process: from torchrun's RANK / WORLD_SIZE / LOCAL_RANK when set
    (joining, or first creating, the process group), else a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank)
    if size > 1 and not dist.is_initialized():
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
        dist.init_process_group("nccl" if resolved.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=30),
                                device_id=resolved if resolved.type == "cuda" else None)
    if size > 1 and dist.get_world_size() != size:
        raise RuntimeError(f"WORLD_SIZE is {size} but the process group has {dist.get_world_size()} ranks")
    return World(rank=rank, size=size, local_rank=local_rank, device=resolved)


def close_world(world: World) -> None:
    """Leave the process group: every rank waits for the others first, so no collective is
    still in flight while gloo's or nccl's threads are torn down."""
    if world.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# ---------------------------------------------------------------------- the wrapped model

class LogprobModel(torch.nn.Module):
    """policy -> log-probs of completion tokens: the module DDP and FSDP2 wrap.

    forward(input_ids (n, T), attention_mask (n, T), completion_mask (n, S)) -> (n, S),
    computed by `logprob_fn(model, ...)` (the fused CPU path or transformers' forward);
    with entropy=True the entropies of the tokens' distributions instead (entropy masking).
    """

    def __init__(self, model: torch.nn.Module, logprob_fn):
        super().__init__()
        self.model = model
        self.logprob_fn = logprob_fn

    def forward(self, input_ids, attention_mask, completion_mask, entropy=False):
        logp = self.logprob_fn(self.model, input_ids, attention_mask, completion_mask, entropy=entropy)
        # A tensor of its own, not a view: FSDP2 hooks its backward on the output, and an
        # in-place op on a view would bypass the hook.
        return logp.clone() if logp._base is not None else logp


def wrap(model: torch.nn.Module, logprob_fn, world: World, parallelism: str, *, trainable: bool,
         per_layer: bool) -> torch.nn.Module:
    """LogprobModel(model), made parallel for training on `world`.

    ddp: DistributedDataParallel (trainable models only; a frozen reference stays
    a plain replica). fsdp2: fully_shard, per decoder layer when `per_layer` (the
    layers' own forwards run: transformers' path) and at the root (which gathers
    whatever the layers do not hold, and for the fused path everything).
    """
    module = LogprobModel(model, logprob_fn)
    if not world.distributed:
        return module
    if parallelism == "ddp":
        if not trainable:
            return module
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(module, device_ids=[world.device.index] if world.device.type == "cuda" else None)
    if parallelism != "fsdp2":
        raise ValueError(f"config key 'parallelism' must be one of {PARALLELISM}, got {parallelism!r}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(world.device.type, (world.size,))
    if per_layer:
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"parallelism = 'fsdp2' shards a model's decoder layers (model.model.layers); "
                         f"{type(model).__name__} has none")
    return list(layers)


def no_sync(module: torch.nn.Module, sync: bool):
    """A context in which backward accumulates gradients locally (sync False) or
    communicates them (sync True): DDP's no_sync, FSDP2's requires_gradient_sync."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(module, "no_sync"):                      # DDP
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):   # FSDP2

        @contextlib.contextmanager
        def unsynced():
            module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                module.set_requires_gradient_sync(True)
        return unsynced()
    return contextlib.nullcontext()


# ---------------------------------------------------------------------- full tensors

def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank, or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole on every rank (a collective), or the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def full_state_dict(model: torch.nn.Module, keep=None) -> dict[str, torch.Tensor]:
    """The model's parameters (each once: tied weights under one name) and persistent
    buffers, whole and on the CPU; `keep(name)`: only those it is true for (LoRA's adapters).
    Under FSDP2 a collective: every rank must call it."""
    keep = keep or (lambda name: True)
    # Each tensor copied into its own storage at once (a gathered one is a view into the
    # collective's buffer).
    state = {name: full_tensor(p.detach()).cpu().clone() for name, p in model.named_parameters() if keep(name)}
    persistent = {name for name, _ in model.named_buffers()} & set(model.state_dict())
    state.update({name: full_tensor(b).cpu().clone() for name, b in model.named_buffers()
                  if name in persistent and keep(name)})
    return state


def copy_full_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """target's parameters <- source's, whole (source may be FSDP2-sharded, target plain)."""
    with torch.no_grad():
        targets = dict(target.named_parameters())
        for name, parameter in source.named_parameters():
            targets[name].copy_(full_tensor(parameter.detach()))


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """optimizer.state_dict() with every sharded state tensor gathered whole: the format a
    1-process run writes, so a checkpoint resumes on any number of ranks."""
    state = optimizer.state_dict()
    state["state"] = {index: {key: full_tensor(value).cpu() if isinstance(value, torch.Tensor) else value
                              for key, value in values.items()}
                      for index, values in state["state"].items()}
    return state


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The inverse of full_optimizer_state: each whole state tensor is cut to this rank's
    shard of its parameter (FSDP2) before the optimizer takes it."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    state = dict(state, state=dict(state["state"]))
    for index, values in state["state"].items():
        parameter = parameters[int(index)]
        if hasattr(parameter, "device_mesh"):
            from torch.distributed.tensor import distribute_tensor
            values = {key: distribute_tensor(value.to(parameter.device), parameter.device_mesh, parameter.placements)
                      if isinstance(value, torch.Tensor) and value.shape == parameter.shape else value
                      for key, value in values.items()}
        state["state"][index] = values
    optimizer.load_state_dict(state)


def memory_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """The bytes this rank holds of the model's parameters, their gradients and the
    optimizer's state (under FSDP2 its shards: about 1/N of each)."""
    parameters = list(model.parameters())

    def size(tensors):
        return sum(local_tensor(t).numel() * local_tensor(t).element_size() for t in tensors)
    state = [] if optimizer is None else [value for values in optimizer.state.values()
                                          for value in values.values()
                                          if isinstance(value, torch.Tensor) and value.ndim > 0]
    return {"parameters": size(parameters),
            "gradients": size(p.grad for p in parameters if p.grad is not None),
            "optimizer": size(state)}

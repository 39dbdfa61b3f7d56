"""grpo_edu: the library behind the GRPO textbook.

The modules, in the order the data goes through one GRPO step (B prompts, G completions
per prompt, S completion tokens):

    tasks.py        prompts with answers a program can check (arithmetic, multiply, countdown, chain, GSM8K)
    rollout.py      G sampled completions per prompt with the sampler's log-probs: the
                    engine protocol, Rollout, and the transformers-generate engine
    fused_llama.py  the fast engine: the same Llama maths fused (KV-cache sampler,
                    group-packed log-probs)
    vllm_engine.py  the GPU tier's engine: vLLM 0.31.0, colocated or a server (every
                    line that calls vLLM)
    rewards.py      one scalar per completion from rules: accuracy, format, language
    advantages.py   group-relative advantages, rewards (B, G) -> advantages (B, G); or per
                    token (B, G, S) from the rewards of every step (process supervision)
    process.py      process supervision: the chain task, its step verifier, each step's
                    reward at its token
    batch.py        RolloutBatch: the step's data in the (B, G, S) layout, checked once
    logprobs.py     per-token log-probs at the sampled ids, without the full log-softmax
    loss.py         the clipped surrogate + KL, aggregated (grpo, bnpo, dr_grpo, dapo, GSPO)
    scoring.py      a rollout's rewards gathered, its advantages and the mini-batch plan
    update.py       reference and pi_old log-probs, micro-batches, the optimizer steps
    metrics.py      what a step logs (reduced over micro-batches and ranks), the run summary
    trainer.py      the loop that wires them, step by step; set-up and finishing

Beside the step:

    placement.py    the policy, reference and sampler copy placed and wrapped, the
                    rollout engine, the forward's precision
    user_functions.py  the reader's own advantage and reward functions by import path,
                    probed at start-up
    distributed.py  one run on N processes: process groups, a step's prompts sharded
                    across ranks (a group never split), DDP/FSDP2 wrapping, whole weights
    evaluation.py   held-out greedy accuracy and format (per problem, so ranks can share
                    the problems), pass@k from samples, with intervals
    checkpoint.py   checkpoints that resume bit for bit and survive a kill or a power cut
    runlog.py       metrics.jsonl, one line per step: the only code that touches it
    durable.py      fsync and atomic replacement of small files (checkpoint and runlog share them)
    config.py       TrainConfig: every training setting, documented once, from TOML
    cli.py          the `grpo-edu` command (train, book, doctor, vllm-serve); __main__.py:
                    `python -m grpo_edu`
    doctor.py       `grpo-edu doctor --gpu`: the GPU machine's pass/fail check of the vLLM engine
    trl_bridge.py   the same run as TRL's GRPOConfig and GRPOTrainer (its production features)
    models.py       the character tokenizer, the tiny Llama, load_policy, generate_completions
    pretrain.py     the supervised run that made the committed starting policy (assets/)
    reference.py    one GRPO update in pure NumPy, a loop per response: the test oracle
    estimators.py   per-token pieces of the objective as functions of numbers (the explorers')
    plots.py        training curves from a run's metrics.jsonl (matplotlib, lazily)
    numerics.py     the pinned floating-point kernels that make runs reproducible anywhere
    worked_example.py  chapter 1's worked example as data, for the explorers and exercises

The book, apart from the algorithm (of the modules above, only cli.py imports it):

    book/           the book's tooling: book.toml, chapter build (book/notebooks.py) and checks
    exercises/      a checker for each chapter's exercises
    widgets         the interactive explorers (folder widgets/, imported as grpo_edu.widgets)
"""

__version__ = "0.1.0"

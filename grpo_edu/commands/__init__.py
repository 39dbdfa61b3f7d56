"""The command-line tools (`grpo-edu ...`; `python -m grpo_edu` is the same).

    cli.py         the `grpo-edu` command: train, eval, sample, book, doctor, vllm-serve
    pretrain.py    the supervised run that made the committed starting policies (assets/)
    trl_bridge.py  the same run as TRL's GRPOConfig and GRPOTrainer (the production peer)
    doctor.py      `grpo-edu doctor --gpu`: the GPU machine's check of the vLLM engine
"""

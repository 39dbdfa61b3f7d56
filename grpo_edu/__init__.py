"""grpo_edu: the library behind the GRPO textbook.

The modules follow the data through one GRPO step (see DESIGN.md): tasks ->
rollout -> rewards -> advantages -> logprobs -> loss -> trainer, with
`reference` as the pure-NumPy oracle every other piece is tested against.
"""

__version__ = "0.1.0"

"""A fake sglang package for the tests: `python -m sglang.launch_server` serves the stand-in
(tests/sglang_standin.py). Only on PYTHONPATH in the tests that start a server; grpo_edu's engine
never imports sglang itself (it speaks HTTP), it only checks that the package is there to launch."""

__version__ = "0.5.23"

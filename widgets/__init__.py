"""Interactive explorers for the book (ipywidgets + matplotlib), imported as
`grpo_edu.widgets`. The core library never imports this package, so a GPU
cluster can install grpo_edu without Jupyter."""

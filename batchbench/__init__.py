"""batchbench: replay agent trajectories against OpenAI-compatible serving stacks."""

__version__ = "0.1.0"

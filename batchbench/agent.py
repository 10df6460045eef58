"""``batchbench.agent.main(argv=None)``: the benchmark's Python entry point, kept at this
name for scripts written against the original tool; the code lives in
``batchbench.cli.agent``."""

from batchbench.cli.agent import console_main, main, run_console

__all__ = ["console_main", "main", "run_console"]

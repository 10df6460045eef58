"""``python -m batchbench.export_plans``: the request-log exporter (``batchbench
export-plans``); the code lives in ``batchbench.cli.export_plans`` and ``batchbench.ingest``."""

from batchbench.cli.export_plans import console_main, run

__all__ = ["console_main", "run"]

if __name__ == "__main__":
    import sys

    sys.exit(run(sys.argv[1:], "python -m batchbench.export_plans"))

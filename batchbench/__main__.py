"""``python -m batchbench``: the same commands as the ``batchbench`` console script."""

from batchbench.cli.main import main

if __name__ == "__main__":
    main()

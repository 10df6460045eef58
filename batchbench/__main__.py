"""``python -m batchbench``: the same commands as the ``batchbench`` console script."""

from batchbench.cli import main

if __name__ == "__main__":
    main()

"""Console entry points: argument parsing, then a run, then rendering."""

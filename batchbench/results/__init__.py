"""What happened: the recorder, metrics and percentiles, JSONL events, reports and the
progress bar."""

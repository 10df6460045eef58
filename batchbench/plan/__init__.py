"""What to send: the manifest (parsed, validated, hashed), sampled size specs, and the
columnar workload compiled from either."""

"""Scale-out: worker processes on one machine, shards across machines, and their merge."""

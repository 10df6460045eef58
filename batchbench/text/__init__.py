"""The exact tokens: tokenizer loading, exact-length trim-stable synthesis (compiled and
pure-Python twin), per-trajectory content, chat templates, prompt counting (one counter for
the client and the simulator) and the framing model."""

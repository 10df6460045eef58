"""The exact tokens: tokenizer loading, exact-length trim-stable synthesis (compiled and
pure-Python twin), per-trajectory content, chat templates and the framing model."""

"""Bounds on what one request can hold, checked before anything is generated."""

# Tokens of one text (a prompt, a tool result, a reply): 16,777,216, far beyond any model's
# context, and about 80 MB of synthetic text, so a typo (a size in bytes, an extra zero)
# is refused with a clear message instead of exhausting memory during synthesis.
MAX_REQUEST_TOKENS = 1 << 24

"""``batchbench record``: an OpenAI-compatible reverse proxy that records the shape of each
chat request (keyed block hashes, token counts, usage, timing) as a COMPAT §7.2 row for
``export-plans``, and never its text."""

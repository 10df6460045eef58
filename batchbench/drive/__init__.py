"""Sending: admission (FIFO ring, routing slots, open-loop timer), the engine, the HTTP
driver and its wire format, prompt sizing, calibration, the prompt oracle, shutdown."""

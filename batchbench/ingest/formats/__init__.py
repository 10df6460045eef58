"""One module per trace format; each only parses its rows into ``Record`` values."""

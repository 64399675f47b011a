"""One module per parsing surface; each exposes ``one_input(data: bytes)``."""

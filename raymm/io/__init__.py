"""Bytes on disk: files written all at once (a crash never leaves one half-written), nested
state as safetensors + JSON (nothing read back can run code), and paths and names that cannot
hurt (a run name that stays inside `--out`, a FIFO refused before it is read).

May import: base.
"""

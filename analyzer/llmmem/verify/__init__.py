"""`llmmem verify`: one real or simulated training step, measured and compared with the estimate.

`request` and `compare` are plain data and arithmetic; `runner`, `tracker` and `worker` import
torch and run in a subprocess of `llmmem verify` (see `llmmem.verify_command`).
"""

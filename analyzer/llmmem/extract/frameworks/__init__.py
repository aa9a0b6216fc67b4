"""One module per framework whose training configs llmmem reads: its keys, its defaults, its
reader and how a fix is written in its config (`FIX_SPELLINGS`, gathered by
`llmmem.rules.spellings`). `llmmem.extract.configs` detects which framework a file is written
for and calls its reader; nothing here imports it. `common` holds what every reader shares
(settings, value conversions, the document reader), `spelling` the shape of a fix's key writes.

Two frameworks have no config file: `deepspeed_chat` (DeepSpeed-Chat's training scripts, read
from their command line: the shell reader takes its flag table, the fixes its spellings) and
`unsloth` (called from a Python script: its defaults, which the Python reader's library table
applies).
"""

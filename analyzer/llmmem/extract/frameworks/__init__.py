"""One module per framework whose training configs llmmem reads: its keys, its defaults, its
reader and how a fix is written in its config (`FIX_SPELLINGS`, gathered by
`llmmem.rules.spellings`). `llmmem.extract.configs` detects which framework a file is written
for and calls its reader; nothing here imports it. `common` holds what every reader shares
(settings, value conversions, the document reader), `spelling` the shape of a fix's key writes.

Three frameworks have no config file: `deepspeed_chat` (DeepSpeed-Chat's training scripts) and
`openrlhf` (OpenRLHF's trainers, `openrlhf.cli.train_*`), both read from their command line (the
shell reader takes their flag tables, the fixes their spellings), and `unsloth` (called from a
Python script: its defaults, which the Python reader's library table applies).
"""

"""One module per framework whose training configs llmmem reads: its keys, its defaults, its
reader and how a fix is written in its config (`FIX_SPELLINGS`, gathered by
`llmmem.rules.spellings`). `llmmem.extract.configs` detects which framework a file is written
for and calls its reader; nothing here imports it. `common` holds what every reader shares
(settings, value conversions, the document reader), `spelling` the shape of a fix's key writes.
"""

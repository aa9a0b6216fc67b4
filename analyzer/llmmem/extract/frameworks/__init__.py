"""One module per framework whose training configs llmmem reads: its keys, its defaults and its
reader. `llmmem.extract.configs` detects which framework a file is written for and calls its reader;
nothing here imports it. `common` holds what every reader shares (settings, value conversions,
the document reader).
"""

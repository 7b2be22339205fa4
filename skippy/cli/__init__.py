"""The `skippy` command and its subcommands, one module each; the top layer (nothing imports it).

Only commands live here: each module parses its flags, builds its process from the packages below
and runs it (`main.py` turns expected errors into one-line messages). `skippy bench KIND` is
registered from `skippy.bench`, which holds every benchmark.
"""

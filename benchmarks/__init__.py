"""The benchmarks, importable as a package (``benchmarks.players``, ``benchmarks.adapters``, ...).

Each script runs as ``python benchmarks/NAME.py`` (it then puts the repository root on
``sys.path`` itself) or as ``python -m benchmarks.NAME`` from the repository root.
"""

"""relay: the lockstep relay server built on relay_core (see README.md)."""
__version__ = "0.1.0"


def _unbuilt_hint() -> "str | None":
    """A source checkout whose compiled modules are not built (a fresh clone, or one run from
    after a non-editable ``pip install .``, which builds them into site-packages only): the
    one-line fix, instead of "No module named 'relay_core.endpoint'" from deep in an import.
    None when the compiled modules are there (an installed package, a built tree)."""
    import importlib.machinery
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    missing = [name for name in ("relay_core/endpoint", "relay/frames")
               if os.path.exists(os.path.join(root, name + ".pyx"))
               and not any(os.path.exists(os.path.join(root, name + suffix))
                           for suffix in importlib.machinery.EXTENSION_SUFFIXES)]
    if not missing:
        return None
    modules = ", ".join(name.replace("/", ".") for name in missing)
    elsewhere = [path for path in sys.path if os.path.abspath(path or os.curdir) != root]
    installed = importlib.machinery.PathFinder.find_spec("relay", elsewhere)
    if installed is not None and installed.origin:
        return (f"the source tree {root} shadows the installed relay "
                f"({os.path.dirname(os.path.dirname(installed.origin))}) and its compiled modules "
                f"({modules}) are not built: run from another directory, or build this tree with "
                f"`python setup.py build_ext --inplace` (or `pip install -e .`)")
    return (f"the compiled modules of the source tree {root} ({modules}) are not built: run "
            f"`python setup.py build_ext --inplace` there (or `pip install -e .`)")


_hint = _unbuilt_hint()
if _hint is not None:
    raise ImportError(f"relay: {_hint}", name="relay")
del _hint

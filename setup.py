"""Build script for the compiled protocol core; metadata lives in pyproject.toml."""
from Cython.Build import cythonize
from setuptools import Extension, setup

CORE_MODULES = ["wire", "seqbuf", "rtt", "fragment", "channel", "block", "peer", "endpoint"]

extensions = [
    Extension(f"relay_core.{name}", [f"relay_core/{name}.pyx"], extra_compile_args=["-O2"])
    for name in CORE_MODULES
] + [
    # Batched UDP syscalls (recvmmsg/sendmmsg) for the server's socket; builds everywhere,
    # does the work on Linux.
    Extension("relay._batchio", ["relay/_batchio.pyx"], extra_compile_args=["-O2"]),
    # The server's per-input receive path (INPUT decode, events to rooms); optional at run time.
    Extension("relay._fastpath", ["relay/_fastpath.pyx"], extra_compile_args=["-O2"]),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)

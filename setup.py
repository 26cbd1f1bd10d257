"""Build script for the compiled protocol core; metadata lives in pyproject.toml."""
from Cython.Build import cythonize
from setuptools import Extension, setup

CORE_MODULES = ["aead", "wire", "seqbuf", "rtt", "redundancy", "fragment", "channel", "block", "peer", "endpoint"]

extensions = [
    Extension(f"relay_core.{name}", [f"relay_core/{name}.pyx"], extra_compile_args=["-O2"])
    for name in CORE_MODULES
] + [
    # Batched UDP syscalls (recvmmsg/sendmmsg) for the server's socket; builds everywhere,
    # does the work on Linux.
    Extension("relay._batchio", ["relay/_batchio.pyx"], extra_compile_args=["-O2"]),
    # The FRAME encoder and the canonical-INPUT decoder.
    Extension("relay.frames", ["relay/frames.pyx"], extra_compile_args=["-O2"]),
    # Input timing's C rings (per player and per room).
    Extension("relay.server.timing", ["relay/server/timing.pyx"], extra_compile_args=["-O2"]),
    # A room's inputs waiting for their frames, in one C block.
    Extension("relay.server.pending", ["relay/server/pending.pyx"], extra_compile_args=["-O2"]),
    # INPUTs from the core straight into their rooms.
    Extension("relay.server.inputs", ["relay/server/inputs.pyx"], extra_compile_args=["-O2"]),
]

# Python source compiled through its .pxd (Cython's pure Python mode): Python's semantics, so
# bounds and negative indexes checked as in Python, and annotations are documentation only
# (the .pxd gives the C types).
PURE_PYTHON_MODE = [
    Extension("relay.server.room", ["relay/server/room.py"], extra_compile_args=["-O2"]),
    Extension("relay.server.history", ["relay/server/history.py"], extra_compile_args=["-O2"]),
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
    ) + cythonize(
        PURE_PYTHON_MODE,
        compiler_directives={"language_level": "3", "annotation_typing": False},
    ),
)

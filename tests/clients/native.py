"""Building the native clients for the tests (clients/c).

The C library is built with CMake into clients/c/build (the same directory a developer uses;
tests/conftest.py's ``c_build`` fixture builds it once per session); a missing toolchain is a
failure, not a skip. Not a conftest.py: tests/conftest.py is imported as ``conftest`` by the
core's tests, and a second one would take its place."""
import os
import shutil
import subprocess
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
C_SOURCE = ROOT / "clients" / "c"
C_BUILD = Path(os.environ.get("RELAY_C_BUILD", C_SOURCE / "build"))


def build_c_library(build_dir: Path = C_BUILD, *extra_args: str) -> Path:
    """Configure (once) and build clients/c; returns the build directory."""
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake is not installed (apt-get install cmake)")
    if not (build_dir / "CMakeCache.txt").exists():
        subprocess.run(["cmake", "-S", str(C_SOURCE), "-B", str(build_dir),
                        "-DCMAKE_BUILD_TYPE=RelWithDebInfo", *extra_args],
                       check=True, capture_output=True, text=True)
    result = subprocess.run(["cmake", "--build", str(build_dir), "-j2"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building clients/c failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return build_dir

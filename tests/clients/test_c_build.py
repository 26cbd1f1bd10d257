"""The C client library builds clean everywhere CI can check, and its own unit tests pass,
plainly and under AddressSanitizer + UndefinedBehaviorSanitizer; its receive path survives a
bounded libFuzzer run seeded with the test vectors."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from native import C_SOURCE, build_c_library

BUILD_ROOT = C_SOURCE


def _ctest(build_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["ctest", "--test-dir", str(build_dir), "--output-on-failure", "-j2"],
                          capture_output=True, text=True, timeout=600)


def test_unit_tests_pass(c_build):
    result = _ctest(c_build)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "tests passed" in result.stdout


def test_unit_tests_pass_under_address_and_undefined_sanitizers():
    build = build_c_library(BUILD_ROOT / "build-sanitize", "-DRELAY_CLIENT_SANITIZE=ON",
                            "-DCMAKE_BUILD_TYPE=Debug")
    result = _ctest(build)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_clang_build_is_warning_free():
    assert shutil.which("clang"), "clang is not installed (apt-get install clang)"
    # -Werror is on by default: a warning fails the build.
    build_c_library(BUILD_ROOT / "build-clang", "-DCMAKE_C_COMPILER=clang",
                    "-DRELAY_CLIENT_TESTS=OFF")


def test_every_source_compiles_for_windows_warning_free():
    """The Winsock driver and the rest, as mingw-w64 compiles them for Windows (-Werror; zlib's
    and libsodium's headers are portable and taken from the host; nothing is linked or run)."""
    compiler = shutil.which("x86_64-w64-mingw32-gcc")
    assert compiler, "mingw-w64 is not installed (apt-get install gcc-mingw-w64-x86-64)"
    sources = sorted((C_SOURCE / "src").glob("*.c")) + sorted((C_SOURCE / "examples").glob("*.c"))
    for source in sources:
        result = subprocess.run(
            [compiler, "-std=c99", "-Wall", "-Wextra", "-Werror", "-Wshadow",
             "-Wstrict-prototypes", "-Wmissing-prototypes", "-DRELAY_CLIENT_BUILDING",
             "-DRELAY_CLIENT_SHARED", f"-I{C_SOURCE / 'include'}", f"-I{C_SOURCE / 'src'}",
             "-idirafter", "/usr/include", "-idirafter", "/usr/include/x86_64-linux-gnu",
             "-fsyntax-only", str(source)], capture_output=True, text=True)
        assert result.returncode == 0, f"{source.name}:\n{result.stderr[-3000:]}"


FUZZ_TARGETS = {
    # the transport: datagrams into a connected rc_conn, open and sealed
    "fuzz_receive": "make_corpus.py",
    # the relay layer: messages and blocks as the connection delivers them, frames taken
    "fuzz_client": "make_client_corpus.py",
}


@pytest.mark.parametrize("target", sorted(FUZZ_TARGETS))
def test_receive_path_survives_bounded_fuzzing(tmp_path, target):
    assert shutil.which("clang"), "clang is not installed (apt-get install clang)"
    build = build_c_library(BUILD_ROOT / "build-fuzz", "-DCMAKE_C_COMPILER=clang",
                            "-DRELAY_CLIENT_FUZZ=ON", "-DRELAY_CLIENT_TESTS=OFF",
                            "-DRELAY_CLIENT_WERROR=ON")
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(C_SOURCE / "fuzz" / FUZZ_TARGETS[target]), str(corpus)],
                   check=True)
    assert any(corpus.iterdir())
    seconds = int(os.environ.get("RELAY_FUZZ_SECONDS", "30"))
    result = subprocess.run(
        [str(build / target), str(corpus), f"-max_total_time={seconds}",
         "-rss_limit_mb=1024", "-print_final_stats=1"],
        capture_output=True, text=True, timeout=seconds + 120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "stat::number_of_executed_units" in result.stderr

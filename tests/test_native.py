"""The C/C++ test drivers (tests/native) built from this checkout and run on every ISA the CPU has.

native_test.cpp exercises the C ABI (error codes for bad arguments, a forced ISA that cannot run) and
simd_test.cpp every SIMD kernel against scalar at odd sizes in exact-size heap buffers: under
AddressSanitizer + UBSan (scripts/asan.sh) wherever the compiler can link them, so that every test run
also checks the native code's memory accesses, not only the device visits that run the script by hand.
"""
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

import kvarn

REPO = Path(__file__).resolve().parents[1]


def _compiler_links_sanitizers(tmp_path: Path) -> bool:
    """Whether the C++ compiler CMake would pick can build and run an ASan + UBSan program."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return False
    src = tmp_path / "probe.cpp"
    src.write_text("int main() { return 0; }\n")
    exe = tmp_path / "probe"
    built = subprocess.run([cxx, "-fsanitize=address,undefined", str(src), "-o", str(exe)], capture_output=True)
    return built.returncode == 0 and subprocess.run([str(exe)], capture_output=True).returncode == 0


def test_native_drivers_pass_on_every_isa(tmp_path):
    if shutil.which("cmake") is None:
        pytest.fail("cmake is not on PATH: install the test extra (pip install '.[test]'), which brings it")
    sanitize = _compiler_links_sanitizers(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "KVARN_ISA"}  # the script forces each ISA itself
    env["KVARN_SANITIZE"] = "ON" if sanitize else "OFF"
    run = subprocess.run(["bash", str(REPO / "scripts" / "asan.sh"), str(tmp_path / "build")],
                         capture_output=True, text=True, env=env, timeout=1800)
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"native drivers failed (sanitizers {env['KVARN_SANITIZE']}):\n{log[-6000:]}"
    for isa in kvarn.available_isas():
        assert f"kvarn native test, ISA {isa}\nok: 0 failure(s)" in run.stdout, f"C ABI driver did not pass on {isa}"
        if isa != "scalar":
            assert f"== {isa}\n" in run.stdout, f"SIMD driver did not compare {isa} with scalar"
            assert f"== {isa}: not available" not in run.stdout
    assert "ok (KVARN_ISA=bogus cannot run): 0 failure(s)" in run.stdout
    assert "all SIMD kernels match scalar" in run.stdout
    if not sanitize:
        warnings.warn("the native drivers ran without sanitizers: this compiler cannot link ASan + UBSan")

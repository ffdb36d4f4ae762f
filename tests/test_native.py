"""The C/C++ test drivers (tests/native) built from this checkout and run on every ISA the CPU has.

native_test.cpp exercises the C ABI (error codes for bad arguments, a forced ISA that cannot run),
examples/c/decode.c uses it from C99 (a cache quantised and attended, checked against float64 attention), and
simd_test.cpp every SIMD kernel against scalar at odd sizes in exact-size heap buffers: under
AddressSanitizer + UBSan (scripts/asan.sh) wherever the compiler can link them, so that every test run
also checks the native code's memory accesses, not only the device visits that run the script by hand.
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path

import pytest

import kvarn

REPO = Path(__file__).resolve().parents[1]


def _compiler_links_sanitizers(tmp_path: Path) -> bool:
    """Whether the C++ compiler CMake would pick (CXX, which may carry arguments: "ccache g++", else c++ / g++ /
    clang++ on PATH) can build and run an ASan + UBSan program with the flags CMake would add."""
    found = [shutil.which(c) for c in ("c++", "g++", "clang++")]
    cxx = shlex.split(os.environ.get("CXX", "")) or [c for c in found if c][:1]
    if not cxx:
        return False
    src = tmp_path / "probe.cpp"
    src.write_text("int main() { return 0; }\n")
    exe = tmp_path / "probe"
    flags = shlex.split(os.environ.get("CXXFLAGS", "")) + shlex.split(os.environ.get("LDFLAGS", ""))
    try:
        built = subprocess.run([*cxx, *flags, "-fsanitize=address,undefined", str(src), "-o", str(exe)],
                               capture_output=True, timeout=300)
        return built.returncode == 0 and subprocess.run([str(exe)], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_native_drivers_pass_on_every_isa(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KVARN_ISA"}  # the script forces each ISA itself
    # The test extra's cmake sits beside this interpreter, which need not be on PATH (an unactivated venv).
    scripts = [d for d in dict.fromkeys([sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]) if d]
    env["PATH"] = os.pathsep.join(scripts + [env.get("PATH", "")])
    if shutil.which("cmake", path=env["PATH"]) is None:
        pytest.fail("cmake is not on PATH: install the test extra (pip install '.[test]'), which brings it")
    sanitize = _compiler_links_sanitizers(tmp_path)
    env["KVARN_SANITIZE"] = "ON" if sanitize else "OFF"
    # Its own process group: on a timeout the build or a hung driver goes too, not only bash.
    proc = subprocess.Popen(["bash", str(REPO / "scripts" / "asan.sh"), str(tmp_path / "build")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"native drivers still running after 30 min:\n{(stdout + stderr)[-6000:]}")
    log = stdout + stderr
    assert proc.returncode == 0, f"native drivers failed (sanitizers {env['KVARN_SANITIZE']}):\n{log[-6000:]}"
    for isa in kvarn.available_isas():
        assert f"kvarn native test, ISA {isa}\nok: 0 failure(s)" in stdout, f"C ABI driver did not pass on {isa}"
        example = [line for line in stdout.splitlines() if line.startswith(f"kvarn C example, ISA {isa}: ")]
        assert len(example) == 1 and example[0].endswith(": ok"), f"the C example (examples/c/decode.c) on {isa}: {example}"
        if isa != "scalar":
            assert f"== {isa}\n" in stdout, f"SIMD driver did not compare {isa} with scalar"
            assert f"== {isa}: not available" not in stdout
    assert "ok (KVARN_ISA=bogus cannot run): 0 failure(s)" in stdout
    assert "all SIMD kernels match scalar" in stdout
    if not sanitize:
        warnings.warn("the native drivers ran without sanitizers: this compiler cannot link ASan + UBSan")

"""Packaging: what pyproject.toml and CMakeLists.txt promise, and what the installed kvarn holds.

Fast and offline: no build, no network. The CMake checks only configure (about a second each)
and skip where cmake is not on PATH; the installed-artifact checks skip when kvarn is imported
from the source tree (editable install or PYTHONPATH=src) rather than from a wheel.
"""
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvarn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG_DIR = os.path.dirname(os.path.abspath(kvarn.__file__))
FROM_SOURCE = os.path.realpath(PKG_DIR) == os.path.realpath(os.path.join(ROOT, "src", "kvarn"))  # not site-packages


def pyproject():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_license_file_exists_and_is_declared():
    # Apache-2.0 requires handing a copy of the licence to recipients: the sdist and the wheel
    # must carry it, and the metadata must name it (PEP 639, scikit-build-core >= 0.11).
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert "LICENSE" in project["license-files"]
    assert not any(c.startswith("License ::") for c in project.get("classifiers", []))  # PEP 639 forbids both
    requires = pyproject()["build-system"]["requires"]
    skb = [r for r in requires if r.startswith("scikit-build-core")]
    assert skb and re.search(r">=\s*0\.(1[1-9]|[2-9]\d)|>=\s*[1-9]", skb[0]), skb  # 0.10 rejects a string licence


def test_numpy_lower_bound():
    # numpy 1.22 cannot .view() a column slice of the uint8 records as float16 ("the array must be
    # C-contiguous"; numpy 1.23 relaxed it): Tile.fields/from_records/to_bytes and
    # KVCache.from_parts fail there (37 tests on Python 3.9 + numpy 1.22.0; all pass on 1.23.0).
    deps = pyproject()["project"]["dependencies"]
    numpy = [d for d in deps if re.match(r"numpy\b", d)]
    assert numpy, deps
    m = re.search(r">=\s*(\d+)\.(\d+)", numpy[0])
    assert m and (int(m.group(1)), int(m.group(2))) >= (1, 23), numpy[0]


def test_python_classifiers_run_from_requires_python_without_gaps():
    # The classifiers list the versions scripts/python_versions.sh ran the suite on; raising requires-python
    # must drop the ones below it, and the list must not skip a minor version.
    project = pyproject()["project"]
    floor = re.fullmatch(r">=\s*3\.(\d+)", project["requires-python"])
    assert floor, project["requires-python"]
    minors = sorted(int(m.group(1)) for c in project["classifiers"]
                    if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c)))
    assert minors and minors[0] == int(floor.group(1)), (minors, project["requires-python"])
    assert minors == list(range(minors[0], minors[-1] + 1)), minors


def test_version_is_the_same_everywhere():
    assert pyproject()["project"]["version"] == kvarn.__version__
    # The CMake package's version (find_package(kvarn X.Y), kvarn.pc's Version) comes from project().
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        assert re.search(r"^project\(kvarn VERSION (\S+) ", f.read(), re.M).group(1) == kvarn.__version__
    if not FROM_SOURCE:
        assert importlib.metadata.version("kvarn") == kvarn.__version__


@pytest.mark.skipif(FROM_SOURCE, reason="kvarn is imported from the source tree, not an installed wheel")
def test_installed_wheel_holds_what_runs_and_nothing_to_build_it():
    names = set(os.listdir(PKG_DIR))
    assert any(n.startswith("_native.") and n.endswith((".so", ".pyd")) for n in names), names
    assert os.path.isfile(os.path.join(PKG_DIR, "data", "smollm2_verne_sample.npz"))
    stray = sorted(n for n in names if n == "CMakeLists.txt" or n.endswith((".pyx", ".pxd", ".cpp", ".o", ".a")))
    assert not stray, f"build inputs in the installed package: {stray}"
    meta = importlib.metadata.metadata("kvarn")
    assert meta["License-Expression"] == "Apache-2.0"
    files = [str(p) for p in importlib.metadata.files("kvarn") or []]
    assert any(p.endswith("licenses/LICENSE") for p in files), files
    # The C library's install (KVARN_INSTALL) is for standalone CMake builds: nothing of it in the wheel.
    c_library = [p for p in files if p.startswith(("include/", "lib/")) or p.endswith((".a", ".pc", ".cmake", ".h"))]
    assert not c_library, f"the C library's files in the wheel: {c_library}"


@pytest.mark.skipif(FROM_SOURCE, reason="kvarn is imported from the source tree, not an installed wheel")
def test_extension_modules_export_only_their_init_function():
    """The C API and C++ internals of the static cores linked into kvarn._native / kvarn._cuda stay hidden
    (they were all exported: a host that loads extensions RTLD_GLOBAL would see kvarn_* and kvarn::; 32 and 51
    of them). Only kvarn's own names are checked: libstdc++'s template instances keep the default visibility its
    headers give them, and a toolchain that links libstdc++ statically exports its runtime (__cxa_*, ...) too."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm on PATH")
    modules = [n for n in os.listdir(PKG_DIR) if n.startswith("_") and n.endswith(".so")]
    assert any(n.startswith("_native.") for n in modules), modules
    for name in modules:
        out = subprocess.run([nm, "-D", "--defined-only", "-C", os.path.join(PKG_DIR, name)], capture_output=True,
                             text=True, check=True).stdout
        symbols = [line.split(maxsplit=2)[2] for line in out.splitlines() if len(line.split(maxsplit=2)) == 3]
        assert f"PyInit_{name.split('.')[0]}" in symbols, (name, symbols[:10])
        leaked = [s for s in symbols if not s.startswith("PyInit_") and "kvarn" in s]
        assert not leaked, f"{name} exports {len(leaked)} internal symbols, e.g. {leaked[:8]}"


def test_cmake_auto_builds_without_cuda_for_an_nvcc_older_than_12(tmp_path):
    """The kernels need CUDA 12.0+ (sm_90a, clusters). Under AUTO an older nvcc on PATH made the whole install fail
    at CMake's CUDA compiler check; now it builds without the CUDA module and says why. KVARN_CUDA=ON refuses it.
    The fake nvcc only answers --version (CMAKE_CUDA_COMPILER given: CMake's own probe is skipped)."""
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] || exit 1\n"
                    "echo 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    fake.chmod(0o755)
    rc, out = _configure(tmp_path, "AUTO", None, f"-DCMAKE_CUDA_COMPILER={fake}")
    assert rc == 0 and "kvarn: CUDA module OFF" in out and "is CUDA 11.8; the CUDA module needs 12.0" in out, out[-2000:]
    rc, out = _configure(tmp_path, "ON", None, f"-DCMAKE_CUDA_COMPILER={fake}")
    assert rc != 0 and "the kernels need 12.0 or later" in " ".join(out.split()), out[-2000:]


def test_cmake_auto_builds_without_cuda_when_cross_compiling(tmp_path):
    """Cross-compiling (here to aarch64, configure only), the nvcc found is the build machine's: its host code
    failed the CUDA module's link ("file in wrong format"). AUTO now builds without the module and says why.
    The fake nvcc is a current one (13.0), which AUTO would take on a native build."""
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] || exit 1\n"
                    "echo 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    fake.chmod(0o755)
    rc, out = _configure(tmp_path, "AUTO", None, f"-DCMAKE_CUDA_COMPILER={fake}", "-DCMAKE_SYSTEM_NAME=Linux",
                         "-DCMAKE_SYSTEM_PROCESSOR=aarch64")
    out = " ".join(out.split())
    assert rc == 0 and "cross-compiling for aarch64: building without the CUDA module" in out, out[-2000:]
    assert "kvarn: CUDA module OFF" in out, out[-2000:]


def test_transformers_extra_bounds_rather_than_pins():
    # The eval extra pins torch for reproducible numbers; the integration alone must install beside the torch an
    # engine already runs (an exact pin made `kvarn[eval]` unresolvable next to any other torch).
    extras = pyproject()["project"]["optional-dependencies"]
    reqs = {re.match(r"[A-Za-z0-9_.-]+", r).group(0): r for r in extras["transformers"]}
    assert set(reqs) == {"torch", "transformers"}, extras["transformers"]
    assert not any("==" in r for r in reqs.values()) and all(">=" in r for r in reqs.values()), reqs


def test_the_transformers_integration_names_its_extra_when_torch_is_missing():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import kvarn.integrations.transformers\nexcept ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert "needs torch and transformers" in r.stdout and "pip install 'kvarn[transformers]'" in r.stdout, r.stdout


def test_import_kvarn_does_not_import_torch():
    code = "import sys, kvarn; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def _configure(tmp_path, value, env=None, *defines):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not on PATH")
    r = subprocess.run([cmake, "-S", ROOT, "-B", str(tmp_path / f"b-{value}"), f"-DKVARN_CUDA={value}", *defines],
                       capture_output=True, text=True, timeout=120, env=env)
    return r.returncode, r.stdout + r.stderr


def test_cmake_rejects_an_unknown_kvarn_cuda_value(tmp_path):
    # Used to be read as a boolean: any typo (or "auto" in lower case) meant ON, and failed
    # with CMake's own "Failed to find nvcc" on a machine without CUDA instead of skipping.
    rc, out = _configure(tmp_path, "AUOT")
    assert rc != 0 and "expected ON, OFF or AUTO" in out, out[-2000:]


def test_cmake_kvarn_cuda_is_case_insensitive(tmp_path):
    # "auto" in lower case, on a machine without a CUDA compiler (CUDACXX names one that is not):
    # it must mean AUTO and build without CUDA; it used to be read as a true boolean, i.e. ON.
    rc, out = _configure(tmp_path, "auto", env=dict(os.environ, CUDACXX="/bin/false"))
    assert rc == 0, out[-2000:]
    assert "kvarn: CUDA module OFF" in out


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the check runs on x86-64 only")
def test_cmake_names_the_assembler_the_avx2_kernels_need(tmp_path):
    # An assembler without AVX-VNNI's {vex} form (binutils before 2.36) used to fail deep in the build with an
    # assembler error; configure now probes it first. The probe's result preset to "no" stands in for such a
    # toolchain (check_cxx_source_compiles does not rerun a result already in the cache).
    rc, out = _configure(tmp_path, "OFF", None, "-DKVARN_ASSEMBLER_KNOWS_AVX_VNNI=OFF")
    assert rc != 0, out[-2000:]
    flat = " ".join(out.split())  # CMake wraps the message
    assert "cannot encode AVX-VNNI" in flat and "binutils 2.36 or later" in flat and "Clang 12" in flat, out[-2000:]


def test_cmake_leaves_the_x86_simd_files_out_elsewhere(tmp_path):
    # aarch64 & co.: avx2/ and avx512/ include <immintrin.h> and used to break the build
    # (pip install of the sdist failed there); now they are left out and the scalar kernels run.
    # Configure only, "cross" to aarch64 with the host compiler: enough to see what gets built.
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not on PATH")
    b = tmp_path / "b"
    r = subprocess.run([cmake, "-S", ROOT, "-B", str(b), "-DKVARN_CUDA=OFF", "-DCMAKE_SYSTEM_NAME=Linux",
                        "-DCMAKE_SYSTEM_PROCESSOR=aarch64"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert "scalar kernels only" in r.stdout
    build_files = "".join(p.read_text(errors="replace") for p in b.rglob("*")
                          if p.is_file() and p.name in ("build.ninja", "build.make", "Makefile2"))
    assert build_files and "kernels_avx2" not in build_files and "kernels_no_x86" in build_files
    assert "avx2_kernels() { return nullptr; }" in (b / "native" / "cpu" / "kernels_no_x86.cpp").read_text()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the ISA files exist on x86-64 only")
def test_isa_files_share_no_code_and_the_baseline_stays_baseline(tmp_path):
    """Builds the native core at -O0 under a global -march=x86-64-v4 (a distribution's CXXFLAGS, or -march=native
    on an AVX-512 build host) and reads the objects. (1) The AVX2 / AVX-512 files define no weak or unique
    symbols: an inline function they emit out of line is one symbol shared with the baseline files, and the
    linker may keep the AVX-512 copy for all (kvarn_layout and TileFormat::layout were, in Debug builds).
    (2) The baseline files hold no VEX/EVEX instruction, global flags or not (they held AVX and contracted FMAs
    before -mno-avx / -ffp-contract=off). (3) The avx2 file holds no EVEX (AVX-512) instruction either."""
    tools = {name: shutil.which(name) for name in ("cmake", "nm", "objdump")}
    if not all(tools.values()):
        pytest.skip(f"needs cmake, nm and objdump on PATH (missing: {[n for n, p in tools.items() if not p]})")
    b = tmp_path / "b"
    r = subprocess.run([tools["cmake"], "-S", ROOT, "-B", str(b), "-DKVARN_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Debug",
                        "-DCMAKE_CXX_FLAGS=-march=x86-64-v4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    r = subprocess.run([tools["cmake"], "--build", str(b), "--target", "kvarn_core", "-j2"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    objects = {p.name.split(".")[0]: p for p in b.rglob("*.o")}
    isa_files, baseline = ("kernels_avx2", "kernels_avx512"), ("api", "dispatch", "kernels_scalar", "sinkhorn_scalar")
    assert set(isa_files + baseline) <= set(objects), sorted(objects)
    for name in isa_files:
        symbols = subprocess.run([tools["nm"], "-C", str(objects[name])], capture_output=True, text=True).stdout
        shared = [line for line in symbols.splitlines() if re.match(r"^\S*\s+[WVu]\s", line)]
        assert not shared, f"{name}: symbols the linker may share with the baseline files: {shared[:10]}"
        assert "avx" in name and symbols.strip()
    vex = re.compile(r":\s+v[a-z0-9]+\s")  # AT&T mnemonics of VEX/EVEX-encoded instructions start with v
    for name in baseline:
        code = subprocess.run([tools["objdump"], "-d", "--no-show-raw-insn", str(objects[name])], capture_output=True,
                              text=True).stdout
        hits = [line.strip() for line in code.splitlines() if vex.search(line)]
        assert code.count("\n") > 100 and not hits, f"{name}: {len(hits)} VEX/EVEX instructions, e.g. {hits[:5]}"
    avx2_code = subprocess.run([tools["objdump"], "-d", "--no-show-raw-insn", str(objects["kernels_avx2"])],
                               capture_output=True, text=True).stdout
    assert len([line for line in avx2_code.splitlines() if vex.search(line)]) > 1000  # the check sees them

    def evex(name):  # instructions whose first byte (after an optional address-size or segment prefix) is 62
        dump = subprocess.run([tools["objdump"], "-d", str(objects[name])], capture_output=True, text=True).stdout
        hits = []
        for line in dump.splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and re.fullmatch(r"\s*[0-9a-f]+:", parts[0]):
                code = parts[1].split()
                if code[:1] == ["62"] or (code[:1] in (["67"], ["2e"], ["3e"], ["26"], ["64"], ["65"], ["36"])
                                          and code[1:2] == ["62"]):
                    hits.append(parts[2].strip())
        return hits

    assert not evex("kernels_avx2"), f"kernels_avx2: AVX-512 instructions, e.g. {evex('kernels_avx2')[:5]}"
    assert len(evex("kernels_avx512")) > 1000  # the check sees them


def test_cmake_serves_a_host_project_through_add_subdirectory(tmp_path):
    """A C or C++ engine can add kvarn's CMake project to its own and link kvarn::core (the C ABI, kvarn/kvarn.h);
    kvarn's test drivers are then left out (KVARN_BUILD_TESTS follows PROJECT_IS_TOP_LEVEL). The host here builds
    and runs examples/c/decode.c (~15 s on 2 cores)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not on PATH")
    host = tmp_path / "host"
    host.mkdir()
    (host / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(host C CXX)\n"
        f"add_subdirectory({Path(ROOT).as_posix()} kvarn)\n"
        f"add_executable(host_decode {Path(ROOT, 'examples', 'c', 'decode.c').as_posix()})\n"
        "target_link_libraries(host_decode PRIVATE kvarn::core m)\n")
    b = tmp_path / "b"
    r = subprocess.run([cmake, "-S", str(host), "-B", str(b), "-DKVARN_CUDA=OFF"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    targets = "".join(p.read_text(errors="replace") for p in b.rglob("*")
                      if p.is_file() and p.name in ("build.ninja", "Makefile2"))
    assert "host_decode" in targets and "kvarn_core" in targets
    assert "kvarn_native_test" not in targets and "kvarn_c_example" not in targets
    r = subprocess.run([cmake, "--build", str(b), "-j", str(os.cpu_count() or 1), "--target", "host_decode"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    exe = next(p for p in b.rglob("host_decode*") if p.is_file() and os.access(p, os.X_OK))
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith(": ok"), r.stdout + r.stderr


def _pc_file_flags(pc_dir: Path, *args: str) -> list:
    """What pkg-config answers for kvarn from pc_dir, read from kvarn.pc itself (it uses only ${var} references and the
    Cflags / Libs fields): the flags on machines without pkg-config, checked against pkg-config where it is
    installed."""
    values = {"pcfiledir": str(pc_dir)}
    fields = {}
    for line in (pc_dir / "kvarn.pc").read_text().splitlines():
        expand = lambda text: re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)  # noqa: E731
        if re.match(r"^\w+=", line):
            name, text = line.split("=", 1)
            values[name] = expand(text)
        elif re.match(r"^[\w.]+:", line):
            name, text = line.split(":", 1)
            fields[name] = expand(text.strip())
    return [word for arg in args for word in fields[{"--cflags": "Cflags", "--libs": "Libs"}[arg]].split()]


def _pkg_config(pc_dir: Path, *args: str) -> list:
    """pkg-config's answer for kvarn from pc_dir (kvarn.pc read here where pkg-config is not installed)."""
    tool = shutil.which("pkg-config")
    if tool is None:
        return _pc_file_flags(pc_dir, *args)
    env = dict(os.environ, PKG_CONFIG_PATH=str(pc_dir))
    r = subprocess.run([tool, *args, "kvarn"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    flags = r.stdout.split()
    assert flags == _pc_file_flags(pc_dir, *args), "the fallback reading of kvarn.pc disagrees with pkg-config"
    return flags


def test_cmake_installs_the_c_library_for_find_package_and_pkg_config(tmp_path):
    """`cmake --install` of a standalone build gives a C or C++ engine the static library, kvarn.h and format.h, a CMake
    package (find_package(kvarn) -> kvarn::core) and kvarn.pc. Checked as a user would: a C-only CMake host (which
    links with the C driver, so the package must bring the C++ runtime) builds and runs examples/c/decode.c against
    the installed package; a newer minor version than installed is refused; the same program compiled with `cc` and
    pkg-config's flags runs from a copy of the prefix moved elsewhere (kvarn.pc locates itself). ~20 s on 2 cores."""
    cmake, cc = shutil.which("cmake"), shutil.which("cc")
    if cmake is None or cc is None:
        pytest.skip(f"needs cmake and cc on PATH (cmake: {cmake}, cc: {cc})")
    build, prefix, example = tmp_path / "b", tmp_path / "prefix", Path(ROOT, "examples", "c", "decode.c").as_posix()

    def run(*cmd, timeout=300, **kwargs):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
        assert r.returncode == 0, (" ".join(map(str, cmd)), (r.stdout + r.stderr)[-3000:])
        return r.stdout

    run(cmake, "-S", ROOT, "-B", build, "-DKVARN_CUDA=OFF", "-DKVARN_BUILD_TESTS=OFF", timeout=120)
    run(cmake, "--build", build, "-j", os.cpu_count() or 1, timeout=900)
    run(cmake, "--install", build, "--prefix", prefix)  # a prefix chosen after configuring
    installed = sorted(p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if p.is_file())
    libdir = next(p for p in installed if p.endswith("/libkvarn.a")).rsplit("/", 1)[0]
    expected = {"include/kvarn/kvarn.h", "include/kvarn/format.h", f"{libdir}/cmake/kvarn/kvarnConfig.cmake",
                f"{libdir}/cmake/kvarn/kvarnConfigVersion.cmake", f"{libdir}/pkgconfig/kvarn.pc"}
    assert expected <= set(installed), installed
    assert "include/kvarn/kernels.h" not in installed  # the ISAs' internal table

    host = tmp_path / "host"
    host.mkdir()

    def configure_host(version):
        (host / "CMakeLists.txt").write_text(
            "cmake_minimum_required(VERSION 3.21)\nproject(host C)\n"
            f"find_package(kvarn {version} CONFIG REQUIRED)\n"
            f"add_executable(host_decode {example})\ntarget_link_libraries(host_decode PRIVATE kvarn::core m)\n")
        return subprocess.run([cmake, "-S", str(host), "-B", str(host / "b"), f"-DCMAKE_PREFIX_PATH={prefix}"],
                              capture_output=True, text=True, timeout=120)

    r = configure_host("0.2")
    text = " ".join((r.stdout + r.stderr).split())
    refusal = f"version: {kvarn.__version__} The version found is not compatible"
    assert r.returncode != 0 and refusal in text, text[-2000:]
    r = configure_host(kvarn.__version__.rsplit(".", 1)[0])
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    run(cmake, "--build", host / "b")
    out = run(host / "b" / "host_decode")
    assert out.strip().endswith(": ok") and "k4v2 tiles" in out, out

    moved = tmp_path / "moved"
    shutil.copytree(prefix, moved)
    shutil.rmtree(prefix)
    pc_dir = moved / libdir / "pkgconfig"
    assert f"\nVersion: {kvarn.__version__}\n" in (pc_dir / "kvarn.pc").read_text()
    exe = tmp_path / "pc_decode"
    run(cc, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", *_pkg_config(pc_dir, "--cflags"), example,
        *_pkg_config(pc_dir, "--libs"), "-o", exe)
    out = run(exe)
    assert out.strip().endswith(": ok"), out

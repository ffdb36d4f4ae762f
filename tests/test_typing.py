"""kvarn ships its types (PEP 561: a py.typed marker and an annotated public API). Without them mypy --strict
refused `import kvarn` in a user's program ("module is installed, but missing library stubs or py.typed marker")
and every kvarn result was Any. Checked against the kvarn these tests import, as a user's mypy would see it."""
import inspect
import os
import re
import subprocess
import sys

import pytest

import kvarn

pytest.importorskip("mypy", reason="mypy comes with the test extra: pip install '.[test]'")

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "typing")
USER_CODE = os.path.join(HERE, "user_code.py")
MISUSE = os.path.join(HERE, "misuse.py")
# the folder holding the kvarn package that was imported above (an installed wheel or the source tree)
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(kvarn.__file__)))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory):
    """mypy --strict over both files in one run (one cold start): {file name: [(line, code, message)]}."""
    cache = tmp_path_factory.mktemp("mypy_cache")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--show-error-codes",
                        "--cache-dir", str(cache), USER_CODE, MISUSE],
                       capture_output=True, text=True, env=_env(), cwd=str(cache), timeout=600)
    found = {}
    for line in r.stdout.splitlines():
        if ": note: " in line:  # mypy's hints beside an error
            continue
        m = re.match(r"(.+?):(\d+): error: (.*)  \[([\w-]+)\]$", line)
        assert m, f"unexpected mypy output line: {line!r}\n{r.stdout}{r.stderr}"
        found.setdefault(os.path.basename(m[1]), []).append((int(m[2]), m[4], m[3]))
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 2: mypy itself failed
    return found


def test_public_api_type_checks_strictly(mypy_report):
    """user_code.py uses every public call and asserts each result's type (assert_type): no error at all."""
    assert mypy_report.get("user_code.py", []) == []


def test_misuse_is_reported(mypy_report):
    """Each line of misuse.py marked `# error: CODE` gets that error, and no other line gets one: the check
    above can fail, and the annotations say what they should (int | None threads, a preset name or Preset...)."""
    expected = []
    with open(MISUSE) as f:
        for number, line in enumerate(f, 1):
            m = re.search(r"# error: ([\w-]+)", line)
            if m:
                expected.append((number, m[1]))
    assert len(expected) >= 10
    assert [(line, code) for line, code, _ in mypy_report.get("misuse.py", [])] == expected


def test_user_code_runs():
    """The type-checked program is a real one: it runs and its shape checks hold."""
    r = subprocess.run([sys.executable, USER_CODE], capture_output=True, text=True, env=_env(), timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_the_wheel_carries_the_marker():
    assert os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(kvarn.__file__)), "py.typed"))


def _unannotated(fn, qualname):
    """The parameters (and return) of fn that carry no annotation."""
    missing = []
    sig = inspect.signature(fn)
    for name, p in sig.parameters.items():
        if name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.annotation is inspect.Parameter.empty:
            missing.append(f"{qualname}({name})")
    if sig.return_annotation is inspect.Signature.empty:
        missing.append(f"{qualname} -> ?")
    return missing


def test_every_public_callable_is_annotated():
    """Everything kvarn exports (functions, and the classes' constructors, public methods and properties) has
    its parameters and result annotated: a new export without them fails here, not in a user's mypy run."""
    missing = []
    for name in kvarn.__all__:
        obj = getattr(kvarn, name)
        if inspect.isfunction(obj):
            missing += _unannotated(obj, name)
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                if isinstance(member, property):
                    missing += _unannotated(member.fget, f"{name}.{attr}")
                elif isinstance(member, (classmethod, staticmethod)):
                    missing += _unannotated(member.__func__, f"{name}.{attr}")
                elif inspect.isfunction(member):
                    missing += _unannotated(member, f"{name}.{attr}")
    assert missing == []

"""The command line: `kvarn demo` on the shipped sample, `kvarn info`, and errors."""
import subprocess
import sys

import kvarn


def run(*args):
    return subprocess.run([sys.executable, "-m", "kvarn", *args], capture_output=True, text=True, cwd="/")


def test_demo_runs_on_the_shipped_real_sample():
    r = run("demo", "--repeats", "1", "--queries", "2")
    assert r.returncode == 0, r.stderr
    assert "sample: real" in r.stdout and "SmolLM2" in r.stdout
    mean = [line for line in r.stdout.splitlines() if line.strip().startswith("mean")][0].split()
    ratio, kvarn_err, kivi_err = float(mean[3].rstrip("x")), float(mean[4]), float(mean[5])
    assert 2.5 < ratio < 4.8  # fp16 sink/tail included on 896 tokens of head_dim 64
    assert 0 < kvarn_err < 0.5 and 0 < kivi_err < 1.0


def test_demo_synthetic_and_other_preset():
    r = run("demo", "--synthetic", "--preset", "k4v4_g128", "--repeats", "1", "--queries", "1")
    assert r.returncode == 0, r.stderr
    assert "SYNTHETIC" in r.stdout and "k4v4_g128" in r.stdout


def test_info_lists_isas_and_presets():
    r = run("info")
    assert r.returncode == 0, r.stderr
    assert f"active: {kvarn.active_isa()}" in r.stdout
    assert "preset k4v2_g128: k4 v2 G=128, 13824 B/record" in r.stdout
    assert "CUDA:" in r.stdout
    assert f"arithmetic (KVARN_SCORES): {kvarn.score_mode()} (" in r.stdout


def test_bad_preset_is_a_clean_error():
    r = run("demo", "--preset", "k9v9")
    assert r.returncode == 2
    assert "preset" in r.stderr and "Traceback" not in r.stderr

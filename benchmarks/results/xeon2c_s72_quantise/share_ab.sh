#!/bin/bash
# alternating old/new quantise-share runs at 1K
cd /work/main/benchmarks
out=/work/main/benchmarks/results/xeon2c_s72_quantise
for r in 1 2 3 4 5 6; do for s in b32 p32; do
  PYTHONPATH=/work/scratch/site_$s KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_${s}_run$r.md \
    python -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_${s}_run$r.log 2>&1
  echo "$s run$r: $(grep -o "= [0-9.]*% of a [0-9.]* ms" $out/share_${s}_run$r.md | tr "\n" " ")"
done; done

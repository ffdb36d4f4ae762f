#!/usr/bin/env bash
# A/B of bench_generate: old build (HEAD 620bbd4, its own script) vs new (working tree), alternating.
cd /work/main
for r in 1 2; do
  PYTHONPATH=/work/scratch/site_mend29 python /work/scratch/s30/gen/bench_generate_old.py --threads 2 --out /work/scratch/s30/gen/run${r}_old.json > /work/scratch/s30/gen/run${r}_old.log 2>&1
  PYTHONPATH=/work/scratch/site_s30 python benchmarks/bench_generate.py --threads 2 --out /work/scratch/s30/gen/run${r}_new.json > /work/scratch/s30/gen/run${r}_new.log 2>&1
done
echo done

# old (CI venv: f7acd60) / new (v: blend+vpshufb unpack) / new2 (v2: the same + odd nibbles kept as 16c for D <= 256), alternating, 1 thread, 32K
for r in 1 2 3 4 5 6; do for shape in 8,32,128 3,9,64; do
  echo -n "r$r old: "; SHAPE=$shape N=200 /tmp/kvarn-ci-venv/bin/python /work/main/benchmarks/results/zen3_2c_s76/aprof.py
  echo -n "r$r new: "; SHAPE=$shape N=200 /work/scratch/s37/v/bin/python /work/main/benchmarks/results/zen3_2c_s76/aprof.py
  echo -n "r$r new2: "; SHAPE=$shape N=200 /work/scratch/s37/v2/bin/python /work/main/benchmarks/results/zen3_2c_s76/aprof.py
done; done

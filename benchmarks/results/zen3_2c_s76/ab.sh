# new (vskip venv: the new value loop) against old (the CI venv: 74811df), alternating processes, 1 thread, 32K
for r in 1 2 3 4 5 6; do for shape in 8,32,128 3,9,64; do
  echo -n "r$r old: "; SHAPE=$shape N=200 /tmp/kvarn-ci-venv/bin/python aprof.py
  echo -n "r$r new: "; SHAPE=$shape N=200 /work/scratch/s36/vskip/bin/python aprof.py
done; done

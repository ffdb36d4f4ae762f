# V-only (HEAD 4a7c404, /tmp/site_vonly) against V+K (working tree, the vskip venv), alternating processes, 1 thread, 32K
PY=/work/scratch/s36/vskip/bin/python
for r in 1 2 3 4 5 6; do for shape in 8,32,128 3,9,64; do
  echo -n "r$r vonly: "; SHAPE=$shape N=200 PYTHONPATH=/tmp/site_vonly $PY aprof.py
  echo -n "r$r vk: "; SHAPE=$shape N=200 $PY aprof.py
done; done

# alternate base / new processes; prints per-alternation new/base ratios
T=$1
for i in 1 2 3 4 5 6 7 8; do
  b=$(cd /tmp && PYTHONPATH=/work/scratch/h48/site_base python /work/scratch/s26/int16_one.py $T)
  n=$(cd /tmp && PYTHONPATH=/work/scratch/site_s26 python /work/scratch/s26/int16_one.py $T)
  echo "threads $T base $b new $n"
done

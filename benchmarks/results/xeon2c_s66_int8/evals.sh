set -x
cd /tmp
export HF_HUB_OFFLINE=1
for spec in "s26 int8 new" "s26 int16 new" "s25 int8 old"; do
  set -- $spec
  /usr/bin/time -f "%e s" env PYTHONPATH=/work/scratch/site_$1 KVARN_SCORES=$2 python -m kvarn eval --presets k4v2_g128,k4v4_g128,k2v2_g128 --no-baselines --gen-prompts 0 --threads 1 --out /work/scratch/s26/eval_$2_$3 > /work/scratch/s26/eval_$2_$3.log 2>&1
done

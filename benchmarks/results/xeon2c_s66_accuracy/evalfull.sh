cd /tmp
export HF_HUB_OFFLINE=1 PYTHONPATH=/work/scratch/site_head
/usr/bin/time -f "%e s" python -m kvarn eval --out /work/scratch/s26/eval_full --threads 2 > /work/scratch/s26/eval_full.log 2>&1
for off in 2048 4096 6144; do
  /usr/bin/time -f "%e s" python -m kvarn eval --offset $off --gen-prompts 0 --decode-steps 0 --threads 2 --out /work/scratch/s26/eval_w$off > /work/scratch/s26/eval_w$off.log 2>&1
done
echo done > /work/scratch/s26/evalfull.done

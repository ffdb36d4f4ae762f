#!/usr/bin/env bash
# Fortieth session, device call s80 (the lent Xeon, CPU only): why 16 threads give ~5 us per record and thread where
# one core of the 2-core Xeon gives ~1.6 (xeon_s80_scaling/scaling.py says how).
set -uo pipefail
. benchmarks/results/device_prologue.sh
D=benchmarks/results/xeon_s80_scaling
build_site . /tmp/site_new || exit 1
echo "[$(el) s] built"
{ lscpu | grep -i 'model name\|mhz\|core\|socket\|numa\|L2\|L3'; grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -c .;
  PYTHONPATH=/tmp/site_new python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kvarn.get_num_threads())"; } | tee "$OUT/machine.txt"
timeout 280 python3 $D/scaling.py threads /tmp/site_new 2>&1 | tee "$OUT/threads.log"
echo "[$(el) s] threads done"
for what in kvarn fp16; do
  for n in 1 4 8 16; do
    echo "== $what, $n processes at once" | tee -a "$OUT/proc.log"
    echo $(( $(date +%s) + 25 )) > /tmp/s80_start
    for i in $(seq 0 $((n - 1))); do
      taskset -c $i timeout 90 python3 $D/scaling.py proc /tmp/site_new $what 3 > /tmp/s80_p$i.log 2>&1 &
    done
    wait
    cat /tmp/s80_p*.log | tee -a "$OUT/proc.log"; rm -f /tmp/s80_p*.log
  done
done
echo "[$(el) s] end"

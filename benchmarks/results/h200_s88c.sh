#!/usr/bin/env bash
# Forty-eighth session, device call s88c: the command run on the same warm machine right after s88b (its build
# still installed), typed inline at the time and kept here as run; outputs in results/h200_s88b/.
mkdir -p $OUT && KVARN_CUDA_STATEFUL_EXAMPLES=2000 timeout 150 python3 -m pytest -q -p no:cacheprovider --hypothesis-show-statistics tests/test_cuda_stateful.py > $OUT/stateful_2000.log 2>&1; echo "rc $?" >> $OUT/stateful_2000.log; tail -2 $OUT/stateful_2000.log; KVARN_CUDA_STATEFUL_EXAMPLES=20 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stateful.py > $OUT/memcheck_20.log 2>&1; echo "rc $?" >> $OUT/memcheck_20.log; tail -3 $OUT/memcheck_20.log

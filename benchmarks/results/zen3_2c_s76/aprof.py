# The twenty-seventh session's per-record timer (xeon2c_s67_stages/aprof.py: SHAPE=hk,hq,D, CTX, TH, N) on the kvarn
# this interpreter imports (that script takes the package's folder as its argument; here the environment picks it).
import os
import runpy
import sys

import kvarn

sys.argv = [sys.argv[0], os.path.dirname(os.path.dirname(os.path.abspath(kvarn.__file__)))]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "xeon2c_s67_stages", "aprof.py"),
               run_name="__main__")

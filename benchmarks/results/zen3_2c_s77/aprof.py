# zen3_2c_s76/aprof.py with VNNI=0: the kernels' vpmaddwd / vpmaddubsw forms, as on a CPU without AVX-VNNI.
import os
import runpy

import kvarn._native

if os.environ.get("VNNI") == "0":
    kvarn._native.set_vnni(False)
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "zen3_2c_s76", "aprof.py"), run_name="__main__")

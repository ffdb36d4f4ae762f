. ../vskip/bin/activate
for r in 1 2 3 4; do for shape in 8,32,128 3,9,64; do for sk in 0 1 2 4 8 16 32 20 0; do
  echo -n "r$r KSKIP=$sk: "; KSKIP=$sk SHAPE=$shape N=200 python aprof.py
done; done; done

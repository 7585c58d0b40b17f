import sys, wide_tvm
print(wide_tvm.__file__)
from wide_tvm.bench.build import build
from wide_tvm.bench.workloads import LLAMA_8B
names = sys.argv[3].split(",")
build(sys.argv[1], "cuda", [w for w in LLAMA_8B if w.name in names], records_of=sys.argv[2] or None)

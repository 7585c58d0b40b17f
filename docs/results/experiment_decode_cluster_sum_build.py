"""The benchmark build of the A/B experiments: some Llama-3.1-8B workloads with the committed database's picks.

    python THIS OUT_DIR REV NAME[,NAME...]   (REV: build today's kernels with the picks REV's code stamped, as
                                             `wide-bench build --records-of REV`; "" for today's own)

Prints which wide_tvm package it built with (a base build runs with PYTHONPATH at another revision's package)."""
import sys, wide_tvm
print(wide_tvm.__file__)
from wide_tvm.bench.build import build
from wide_tvm.bench.workloads import LLAMA_8B
names = sys.argv[3].split(",")
build(sys.argv[1], "cuda", [w for w in LLAMA_8B if w.name in names], records_of=sys.argv[2] or None)

"""Copy knob records between tuning databases, skipping the records the destination holds already.

Either the records of the tasks a regex names into another folder, or every record of one folder into another.

The device tool carries the whole working tree and the full TVM bundle (~61 MB) in 64 MiB, which leaves no room for
the committed CUDA database (~10 MB) or the docs: to tune on the GPU host, copy the tasks to tune into a subset folder
(git-ignored, carried), move docs/, tests/ and tuning_logs/ out of the working tree for that one call (and back right
after), tune into the subset there with --force, and merge the folder that comes back into the committed database:

    python tools/db_records.py tuning_logs/cuda-sm90 .exp/sub --only 'gemm_mn/g8x512/d4096/float16/decode0$'
    # the call, carrying .gpu (the full bundle) and .exp/sub:
    #   . .gpu/env.sh && mkdir -p $OUT/sub && cp .exp/sub/* $OUT/sub/ && tools/gpu_tune.sh --llama8b --target cuda \
    #       --only '...' --force --trials N --out $OUT/sub
    python tools/db_records.py RETURNED_SUB tuning_logs/cuda-sm90

A record is the same when its workload and its JSON (trace, run times, target) are (database.record_key), so the
returned folder, which started as the subset, adds only the records measured there.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="tuning folder to read (database_workload.json + database_tuning_record.json)")
    p.add_argument("dst", help="tuning folder to append to (created if missing)")
    p.add_argument("--only", default="", help="copy only the records of the tasks this regex finds (wide-tune's task "
                   "names, e.g. 'gemm_k/g8x512/d4096/float16/decode0$')")
    args = p.parse_args()
    from wide_tvm.tuning.database import RECORD_FILE, copy_records

    if not os.path.exists(os.path.join(args.src, RECORD_FILE)):
        p.error(f"{args.src}: no tuning database ({RECORD_FILE})")
    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        p.error("src and dst are the same folder")
    added, skipped = copy_records(args.src, args.dst, args.only)
    print(f"{args.dst}: {added} records added, {skipped} already there")
    return 0


if __name__ == "__main__":
    sys.exit(main())

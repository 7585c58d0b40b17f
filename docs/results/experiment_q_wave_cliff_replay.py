import json, sys, glob, numpy as np
from wide_tvm.kernel_reference import make_mask
from wide_tvm.bench.workloads import LLAMA_8B
W={w.name:w for w in LLAMA_8B}
def replay(path):
    d=json.load(open(path)); rows=d['rows']
    rng=np.random.default_rng(0)
    out=[]
    for r in rows:
        w=W[r['workload']]; m=r['tokens']
        pool=[make_mask(r['mask'],m,w.groups,rng,r['sparsity']) for _ in range(r['mask_draws'])]
        ms=float(1-np.mean(pool))
        assert abs(ms-r['measured_sparsity'])<1e-12, (path, r['workload'], m, ms, r['measured_sparsity'])
        if r['workload']=='q_proj_h4' and m==4096 and r['sparsity']==0.5 and r['mask']=='random':
            tiles=[int(np.sum(np.ceil(p.sum(0)/128))*2) for p in pool]
            out.append((r['kernel_us'], tiles, sum(t>264 for t in tiles)))
    return out
for p in sorted(sys.argv[1:]):
    try: print(p.split('/')[-1], replay(p))
    except AssertionError as e: print(p.split('/')[-1], "MISMATCH", e)
    except Exception as e: print(p.split('/')[-1], "ERR", type(e).__name__, e)

# The staged helpers of session 31's calls (bash bench/session.sh ... h:NAME:SECONDS ran .dev-NAME/run.sh).

# call 2, .dev-ops/run.sh: the grouped GEMMs on main, the candidate and the n256-only build (p1); the MoE movers
for b in build build-cand build-p1; do echo "== $b --grouped"; timeout 60 $b/bench_gpu_ops --grouped 2>&1 | grep -v BENCH; done
for b in build build-cand; do echo "== $b (default rows: moe)"; timeout 100 $b/bench_gpu_ops 2>&1 | grep -iE "moe|gather|scatter"; done

# call 3, .dev-gw/run.sh (the candidate then read PITH_WG_WASTE, the largest fraction of wasted products at which a
# ragged width took 256-wide tiles; the final tree fixes it at 1/12 and reads no variable)
PITH_WG_WASTE=1 timeout 60 build-cand/test_gpu gpu_op_grouped_wgmma 2>&1 | tail -3
PITH_WG_WASTE=1 timeout 60 build-cand/test_gpu gpu_op_fp8_grouped 2>&1 | tail -1
for r in 1 2; do for b in build-cand build-p1; do echo "== $b run $r"; timeout 60 $b/bench_gpu_ops --grouped wgmma | grep -v BENCH; done; done
echo "== build-cand waste 0.07"; PITH_WG_WASTE=0.07 timeout 60 build-cand/bench_gpu_ops --grouped wgmma | grep -v BENCH
echo "== build-cand waste 0"; PITH_WG_WASTE=0 timeout 60 build-cand/bench_gpu_ops --grouped wgmma | grep -v BENCH

# call 4, .dev-san/run.sh: san_run.sh in call4/

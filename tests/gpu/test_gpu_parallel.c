// test_gpu_parallel.c — two GPUs, one rank each (skipped with fewer): the NCCL transport under mpirun -np 2.
// Collectives on device buffers (fp32, fp64, int, bf16), EP dispatch/combine and zigzag ring attention at cp2
// (fp32 against one-rank attention, GQA and the MLA latent form; build/test_parallel *-gpu);
// a rank that stops taking part (the watchdog's timeout) and a rank killed mid-run; `pith train` at ep2,
// dp2, pp2 (DualPipeV, 4 micro-batches) and cp2 (zigzag ring) against the same run on one GPU (pp2 × ep2
// needs four ranks, and NCCL takes one rank per GPU): fp32 step-1 loss ≤ 1e-5 relative and every gradient tensor
// ≤ 1e-5 (‖a−b‖/‖b‖); bf16 step-1 loss ≤ 1e-2 and every gradient tensor calc_diff ≤ 1e-2; the loss over
// 10 steps (fp32 ≤ 1e-4, bf16 ≤ 2e-2, where AdamW amplifies last-bit differences); fp32 also against
// one CPU process (printed).
#include "base/safetensors.h"
#include "gpu_test.h"
#ifdef PITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

#define MPIRUN2                                                                                                        \
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2 mpirun --bind-to none -np 2"
#ifdef PITH_FAKE_CUDA // built with FAKE_CUDA=1 to try these tests on fake GPUs: fp32 only
#define NDTYPES 1
#else
#define NDTYPES 2
#endif

// build/test_parallel beside the pith binary under test (build-fake/ with fake GPUs).
static const char *test_parallel_bin(void) {
    static char path[512];
    const char *b = PITH_BIN, *slash = strrchr(b, '/');
    snprintf(path, sizeof path, "%.*stest_parallel", slash ? (int)(slash - b + 1) : 0, b);
    return path;
}

// Skips the test with fewer than two GPUs; no CUDA context is made here (the ranks make their own).
static void need_two_gpus(void) {
    if (!getenv("PITH_TEST_GPU"))
        test_fail(__FILE__, __LINE__, "run the GPU suite through `make test-gpu2` (PITH_TEST_GPU=1)");
#ifdef PITH_CUDA
    int n = cuda_device_count();
#else
    int n = 0;
#endif
    if (n < 2) test_skip("%d GPU(s) here, these tests need 2", n);
    char out[256];
    ASSERT_MSG(run_cmd(out, sizeof out, "test -x %s", test_parallel_bin()) == 0,
               "%s is missing: make test-gpu2 builds it", test_parallel_bin());
}

TEST(gpu2_collectives_and_ep) {
    need_two_gpus();
    static char out[1 << 16];
    const char *suites[] = {"comm-gpu", "ep-gpu", "ring-gpu"};
    for (int i = 0; i < 3; i++) {
        double t0 = now_seconds();
        int rc = run_cmd(out, sizeof out, MPIRUN2 " %s %s", test_parallel_bin(), suites[i]);
        printf("     %-9s %.1f s  %.*s\n", suites[i], now_seconds() - t0, (int)strcspn(out, "\n"), out);
        ASSERT_MSG(rc == 0 && strstr(out, "ok ") && strstr(out, suites[i]), "%s: %s", suites[i], out);
    }
}

TEST(gpu2_failures) {
    need_two_gpus();
    static char out[1 << 16];
    // rank 1 stops taking part: rank 0's watchdog ends the job at parallel.timeout_s (3 s) naming rank and call
    double t0 = now_seconds();
    int rc = run_cmd(out, sizeof out, MPIRUN2 " %s hang-gpu", test_parallel_bin());
    double took = now_seconds() - t0;
    printf("     hang: %.1f s\n", took);
    ASSERT_MSG(rc != 0 && took < 40 &&
                   strstr(out, "pith: error: rank 0: all-reduce on the world group (2 ranks) did not") &&
                   strstr(out, "parallel.timeout_s = 3 s"),
               "%.1f s: %s", took, out);
    // rank 1 killed mid-run: the job ends and mpirun names the rank
    const char *d = test_tmpdir();
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/data.bin --vocab 256 --tokens 100000 >/dev/null", PITH_BIN,
                   d) == 0);
    t0 = now_seconds();
    rc = run_cmd(
        out, sizeof out,
        MPIRUN2 " %s train examples/tiny/train.json --set device=cuda --set compute_dtype=fp32 --set "
                "dataset=%s/data.bin --set max_steps=1000000 --set "
                "parallel.expert_parallel_size=2 --set parallel.timeout_s=20 --set run_dir=%s/k >/dev/null 2>%s/k.err &"
                " p=$!; sleep 12; kill -9 $(pgrep -P $p | tail -1); wait $p; echo status $?; cat %s/k.err",
        PITH_BIN, d, d, d, d);
    took = now_seconds() - t0;
    printf("     kill -9: %.1f s\n", took);
    ASSERT_MSG(rc == 0 && !strstr(out, "status 0") && strstr(out, "rank 1") && took < 60, "%.1f s: %s", took, out);
}

// ---- layout equivalence ----

static const char *model_json = TINY_MOE_EP_OF(4); // four layers: DualPipeV at pp2 cuts 2 × 2 chunks

static double metric(const char *dir, int step, const char *key) {
    static char out[1 << 16];
    char pat[64];
    ASSERT(run_cmd(out, sizeof out, "grep '^{\"step\": %d,' %s/metrics.jsonl", step, dir) == 0);
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *p = strstr(out, pat);
    ASSERT_MSG(p, "no %s in %s", key, out);
    return strtod(p + strlen(pat), NULL);
}

// Worst per-tensor difference of two gradient dumps: ‖a−b‖/‖b‖, or calc_diff.
static double gpu_grad_diff(const char *a, const char *b, bool use_calc_diff, char *worst_name, size_t cap) {
    StSet x, y;
    st_set_open_or_die(&x, a);
    st_set_open_or_die(&y, b);
    ASSERT_MSG(x.n == y.n, "%s holds %d tensors, %s %d", a, x.n, b, y.n);
    double worst = 0;
    snprintf(worst_name, cap, "-");
    for (int i = 0; i < x.n; i++) {
        const StTensor *t = st_set_find(&y, x.t[i]->name);
        ASSERT_MSG(t && t->numel == x.t[i]->numel, "%s missing or reshaped in %s", x.t[i]->name, b);
        float *u = xmalloc(t->numel * sizeof(float) + 1), *v = xmalloc(t->numel * sizeof(float) + 1);
        st_read_f32(x.t[i], u), st_read_f32(t, v);
        double e = use_calc_diff ? calc_diff(u, v, t->numel) : rel_err_f32(u, v, t->numel);
        if (e >= worst) worst = e, snprintf(worst_name, cap, "%s", t->name);
        free(u), free(v);
    }
    st_set_close(&x), st_set_close(&y);
    return worst;
}

TEST(gpu2_equivalence) {
    need_two_gpus();
    static char out[1 << 16];
    char d[256], dir[512], ref[512], name[200];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    ASSERT(run_cmd(out, sizeof out,
                   "echo '%s' > %s/model.json && %s synth --output %s/data.bin --vocab 64 --tokens 20000 >/dev/null",
                   model_json, d, PITH_BIN, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   "echo '{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 16, "
                   "\"micro_batch_size\": 2,"
                   " \"global_batch_size\": 8, \"max_steps\": 10, \"device\": \"cuda\", \"optimizer\": {\"lr\": 0.01},"
                   " \"moe_load_balance_coef\": 0.01, \"parallel\": {\"timeout_s\": 120}}' > %s/train.json",
                   d) == 0);
    ASSERT(
        run_cmd(out, sizeof out,
                "OMP_NUM_THREADS=2 %s train %s/train.json --set device=cpu --set run_dir=%s/cpu --dump-grads %s/cpu/g",
                PITH_BIN, d, d, d) == 0);
    static const struct {
        const char *name, *sets;
    } layouts[] = {{"ep2", "--set parallel.expert_parallel_size=2"},
                   {"dp2", ""},
                   {"pp2", "--set parallel.pipeline_parallel_size=2"},
                   {"cp2", "--set parallel.context_parallel_size=2"}};
    const char *dtypes[] = {"fp32", "bf16"};
    printf("     layout dtype  step-1 loss   10-step loss  worst gradient (vs one GPU)             fp32 vs one CPU "
           "process\n");
    for (int m = 0; m < NDTYPES; m++) {
        bool bf16 = m == 1;
        gpu_mode(bf16 ? DT_BF16 : DT_F32);
        snprintf(ref, sizeof ref, "%s/one-%s", d, dtypes[m]);
        int rc =
            run_cmd(out, sizeof out, "%s train %s/train.json --set compute_dtype=%s --set run_dir=%s --dump-grads %s/g",
                    PITH_BIN, d, dtypes[m], ref, ref);
        ASSERT_MSG(rc == 0, "one GPU, %s: %s", dtypes[m], out);
        for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
            snprintf(dir, sizeof dir, "%s/%s-%s", d, layouts[i].name, dtypes[m]);
            double t0 = now_seconds();
            rc = run_cmd(out, sizeof out,
                         "PITH=%s scripts/launch.sh -n 2 %s/train.json --set compute_dtype=%s %s --set run_dir=%s "
                         "--dump-grads %s/g 2>&1",
                         PITH_BIN, d, dtypes[m], layouts[i].sets, dir, dir);
            ASSERT_MSG(rc == 0 && strstr(out, "mesh: 2 ranks"), "%s %s (%.1f s): %s", layouts[i].name, dtypes[m],
                       now_seconds() - t0, out);
            double l1 = metric(dir, 1, "loss"), r1 = metric(ref, 1, "loss"), e1 = fabs(l1 - r1) / r1, worst = e1;
            for (int s = 2; s <= 10; s++) {
                double l = metric(dir, s, "loss"), r = metric(ref, s, "loss");
                worst = fmax(worst, isnan(l) ? INFINITY : fabs(l - r) / r);
            }
            char ga[600], gb[600], gc[600];
            snprintf(ga, sizeof ga, "%s/g", dir), snprintf(gb, sizeof gb, "%s/g", ref),
                snprintf(gc, sizeof gc, "%s/cpu/g", d);
            double gd = gpu_grad_diff(ga, gb, bf16, name, sizeof name), cpu = 0;
            char cpu_name[200] = "";
            if (!bf16) cpu = gpu_grad_diff(ga, gc, false, cpu_name, sizeof cpu_name);
            printf("     %-6s %-5s  %.2e      %.2e      %s %.2e (%s)", layouts[i].name, dtypes[m], e1, worst,
                   bf16 ? "calc_diff" : "rel err  ", gd, name);
            if (!bf16) {
                char cdir[300];
                snprintf(cdir, sizeof cdir, "%s/cpu", d);
                double lc = metric(cdir, 1, "loss");
                printf("   loss %.1e, gradient %.1e (%s)", fabs(l1 - lc) / lc, cpu, cpu_name);
            }
            printf("\n");
            record_err(gd, name);
            ASSERT_MSG(e1 <= (bf16 ? 1e-2 : 1e-5), "%s %s: step-1 loss %.9g vs one GPU %.9g", layouts[i].name,
                       dtypes[m], l1, r1);
            ASSERT_MSG(worst <= (bf16 ? 2e-2 : 1e-4), "%s %s: the 10-step loss curve is off one GPU's by %.3g",
                       layouts[i].name, dtypes[m], worst);
            ASSERT_MSG(gd <= (bf16 ? 1e-2 : 1e-5), "%s %s: gradient of %s differs by %.3g", layouts[i].name, dtypes[m],
                       name, gd);
        }
    }
    gpu_report();
}

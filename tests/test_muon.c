// test_muon.c — the Muon optimizer: its ops and two whole training steps against a float64 reference written
// here from the update's definition (docs/architecture.md, "Muon"), and one step of every parameter class against
// tests/muon/fixture.safetensors, made with PyTorch in float64 by tests/muon/make_fixture.py.
#include "base/safetensors.h"
#include "ops/ops.h"
#include "test.h"
#include "train/trainer.h"

// Newton–Schulz in fp64 exactly as defined: X = G (Gᵀ when n > m), X /= ‖X‖_F + 1e-7, `steps` times
// A = X Xᵀ, B = b·A + c·A·A, X = a·X + B·X; transposed back. g: (n, m) in, out: (n, m).
static void newton_schulz_ref(const double *g, double *out, int n, int m, int steps) {
    bool tall = n > m;
    int r = tall ? m : n, c = tall ? n : m;
    double *X = xcalloc((size_t)r * c, 8), *A = xcalloc((size_t)r * r, 8), *B = xcalloc((size_t)r * r, 8),
           *Y = xcalloc((size_t)r * c, 8);
    double ss = 0;
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++)
            X[i * c + j] = tall ? g[j * m + i] : g[i * m + j], ss += X[i * c + j] * X[i * c + j];
    for (int i = 0; i < r * c; i++) X[i] /= sqrt(ss) + 1e-7;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                double acc = 0;
                for (int k = 0; k < c; k++) acc += X[i * c + k] * X[j * c + k];
                A[i * r + j] = acc;
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += A[i * r + k] * A[k * r + j];
                B[i * r + j] = -4.7750 * A[i * r + j] + 2.0315 * acc;
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += B[i * r + k] * X[k * c + j];
                Y[i * c + j] = 3.4445 * X[i * c + j] + acc;
            }
        memcpy(X, Y, sizeof(double) * r * c);
    }
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) out[tall ? j * m + i : i * m + j] = X[i * c + j];
    free(X), free(A), free(B), free(Y);
}

TEST(op_newton_schulz_against_fp64) {
    static const int shapes[][3] = {{1, 16, 16}, {1, 8, 24}, {1, 24, 8}, {3, 12, 20},
                                    {2, 20, 12}, {4, 1, 4},  {1, 64, 48}};
    double worst = 0;
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        int B = shapes[t][0], n = shapes[t][1], m = shapes[t][2];
        float *x = xmalloc(sizeof(float) * B * n * m), *orig = xmalloc(sizeof(float) * B * n * m);
        fill_normal(orig, (int64_t)B * n * m, 0.3f);
        memcpy(x, orig, sizeof(float) * B * n * m);
        int64_t wsn = op_newton_schulz_workspace(n, m);
        float *ws = xmalloc(sizeof(float) * wsn);
        for (int64_t i = 0; i < wsn; i++) ws[i] = NAN; // the op must not read scratch it did not write
        op_newton_schulz(tensor_make(x, DT_F32, DEV_CPU, 3, B, n, m, 1),
                         tensor_make(ws, DT_F32, DEV_CPU, 1, wsn, 1, 1, 1), 5);
        double *ref = xmalloc(sizeof(double) * n * m), *got = xmalloc(sizeof(double) * n * m);
        for (int e = 0; e < B; e++) { // batched: each matrix on its own, as PithTrain's per-expert norm
            for (int i = 0; i < n * m; i++) got[i] = orig[(size_t)e * n * m + i];
            newton_schulz_ref(got, ref, n, m, 5);
            for (int i = 0; i < n * m; i++) got[i] = x[(size_t)e * n * m + i];
            double err = rel_err_f64(got, ref, n * m);
            worst = fmax(worst, err);
            ASSERT_MSG(err < 1e-5, "(%d, %d, %d) matrix %d: relative error %.3g", B, n, m, e, err);
        }
        // Newton–Schulz moves the singular values into about (0.5, 1.5): ‖X‖_F² = Σσ² is in (0.25, 2.25)·min(n, m).
        double ss = 0;
        for (int i = 0; i < n * m; i++) ss += ref[i] * ref[i];
        ASSERT_MSG(ss > 0.25 * (n < m ? n : m) && ss < 2.25 * (n < m ? n : m), "(%d, %d): ‖X‖² = %g", n, m, ss);
        free(x), free(orig), free(ws), free(ref), free(got);
    }
    printf("     7 shapes (square, wide, tall, batched, 1×4): worst relative error %.2e vs fp64\n", worst);
}

TEST(op_muon_momentum_and_apply) {
    enum { N = 1000 };
    float buf[N], g[N], p[N], o[N], b0[N], g0[N], p0[N];
    fill_normal(buf, N, 1), fill_normal(g, N, 1), fill_normal(p, N, 1), fill_normal(o, N, 1);
    memcpy(b0, buf, sizeof buf), memcpy(g0, g, sizeof g), memcpy(p0, p, sizeof p);
    const double beta = 0.95, lr = 0.02, wd = 0.1, scale = 0.2 * sqrt(48.0);
    op_muon_momentum(tf32_1(buf, N), tf32_1(g, N), (float)beta);
    op_muon_apply(tf32_1(p, N), tf32_1(o, N), (float)lr, (float)wd, (float)scale);
    for (int i = 0; i < N; i++) {
        double nb = beta * b0[i] + (1 - beta) * g0[i], u = (1 - beta) * g0[i] + beta * nb;
        double np = p0[i] * (1 - lr * wd) - lr * scale * o[i];
        ASSERT_NEAR(buf[i], nb, 1e-6 * (1 + fabs(nb)));
        ASSERT_NEAR(g[i], u, 1e-6 * (1 + fabs(u)));
        ASSERT_NEAR(p[i], np, 1e-6 * (1 + fabs(np)));
    }
}

TEST(muon_param_classes) {
    // PithTrain's is_muon_param on pith's canonical names, with the spec's edge cases.
    static const struct {
        const char *name;
        int nd;
        bool muon;
    } cases[] = {
        {"embed_tokens.weight", 2, false},
        {"lm_head.weight", 2, false},
        {"layers.0.self_attn.q_proj.weight", 2, true},
        {"layers.0.self_attn.q_proj.bias", 1, false},
        {"layers.0.self_attn.q_norm.weight", 1, false},
        {"layers.0.input_layernorm.weight", 1, false},
        {"layers.0.mlp.gate.weight", 2, false},
        {"layers.0.mlp.router.weight", 2, false},
        {"layers.0.mlp.experts.3.gate_proj.weight", 2, true},
        {"layers.0.mlp.experts.3.down_proj.weight", 2, true},
        {"layers.0.mlp.experts.gate_up_proj", 3, true},
        {"layers.0.mlp.experts.gate_up_proj_bias", 2, false},
        {"layers.0.mlp.shared_expert_gate.weight", 2, true},
        {"layers.0.linear_attn.conv1d.weight", 3, true},
        {"layers.0.linear_attn.A_log", 1, false},
        {"layers.0.self_attn.sinks", 1, false},
        {"layers.1.mlp.down_proj.weight", 2, true},
        {"norm.weight", 1, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        ASSERT_MSG(muon_param(cases[i].name, cases[i].nd) == cases[i].muon, "%s", cases[i].name);
}

// A tiny Qwen3-MoE (layer 1 dense) trained with Muon, no clipping, load balancing on (router gradients).
static const char *make_muon_run(void) {
    static char d[256];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    char out[8192];
    ASSERT(
        run_cmd(
            out, sizeof out,
            "echo '{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 64, "
            "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"intermediate_size\": 12, "
            "\"mlp_only_layers\": [1]}' > %s/model.json && %s synth --output %s/data.bin --vocab 64 --tokens 3000 && "
            "echo '{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 8, "
            "\"micro_batch_size\": 2, \"global_batch_size\": 4, \"max_steps\": 6, \"device\": \"cpu\", "
            "\"clip_grad_norm\": 0, \"moe_load_balance_coef\": 0.01, "
            "\"optimizer\": {\"type\": \"muon\", \"lr\": 0.02, \"momentum\": 0.95, \"weight_decay\": 0.1}}' > "
            "%s/train.json",
            d, PITH_BIN, d, d) == 0);
    return d;
}

// Two Muon steps of every parameter tensor against fp64: the update rule of docs/architecture.md ("Muon")
// applied to the gradients the run dumped, from the same initial weights.
TEST(muon_two_steps_every_parameter_class_against_fp64) {
    const char *d = make_muon_run();
    char path[512];
    snprintf(path, sizeof path, "%s/train.json", d);
    TrainConfig c;
    config_load(&c, path, NULL, 0);
    static Run r;
    run_setup(&r, &c, true);
    ASSERT(r.muon.on);
    const ParamTable *t = &r.model.params;
    // The experts' gate/up matrices of a layer are one batch of 2E matrices (adjacent, one shape).
    bool batched = false;
    for (int i = 0; i < r.muon.nbatches[GROUP_EXPERT]; i++) batched |= r.muon.batches[GROUP_EXPERT][i].count == 8;
    ASSERT(batched);
    double *p[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) {
        int64_t n = t->numel[g];
        float *w = (float *)r.master[g].p;
        p[g] = xmalloc(sizeof(double) * (n + 1));
        for (int64_t i = 0; i < n; i++) p[g][i] = w[i];
    }
    for (int s = 1; s <= 2; s++) {
        snprintf(r.dump_grads, sizeof r.dump_grads, "%s/g%d", d, s);
        run_step(&r);
    }
    StSet g1, g2;
    snprintf(path, sizeof path, "%s/g1", d), st_set_open_or_die(&g1, path);
    snprintf(path, sizeof path, "%s/g2", d), st_set_open_or_die(&g2, path);
    const double lr = 0.02, wd = 0.1, beta = 0.95, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double worst[2] = {0, 0};
    int counted[2] = {0, 0};
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *pi = &t->p[i];
        int64_t n = params_numel(pi);
        bool muon = muon_param(pi->name, pi->nd);
        float *gr[2] = {xmalloc(sizeof(float) * n), xmalloc(sizeof(float) * n)};
        const StTensor *a = st_set_find(&g1, pi->name), *b = st_set_find(&g2, pi->name);
        ASSERT_MSG(a && b, "%s: no gradient dumped", pi->name);
        st_read_f32(a, gr[0]), st_read_f32(b, gr[1]);
        double *w = xmalloc(sizeof(double) * n), *m1 = xcalloc(n, 8), *v = xcalloc(n, 8),
               *u = xmalloc(sizeof(double) * n), *o = xmalloc(sizeof(double) * n);
        memcpy(w, p[pi->group] + pi->off, sizeof(double) * n);
        int64_t rows = pi->shape[pi->nd - 2], cols = pi->shape[pi->nd - 1];
        for (int s = 0; s < 2; s++) {
            if (muon) { // momentum (Nesterov-style), Newton–Schulz, Moonlight scale, decoupled decay
                for (int64_t j = 0; j < n; j++)
                    m1[j] = beta * m1[j] + (1 - beta) * gr[s][j], u[j] = (1 - beta) * gr[s][j] + beta * m1[j];
                newton_schulz_ref(u, o, (int)rows, (int)cols, 5);
                double scale = 0.2 * sqrt((double)(rows > cols ? rows : cols));
                for (int64_t j = 0; j < n; j++) w[j] = w[j] * (1 - lr * wd) - lr * scale * o[j];
            } else { // torch.optim.AdamW
                for (int64_t j = 0; j < n; j++) {
                    double gj = gr[s][j];
                    m1[j] = b1 * m1[j] + (1 - b1) * gj, v[j] = b2 * v[j] + (1 - b2) * gj * gj;
                    double mh = m1[j] / (1 - pow(b1, s + 1)), vh = v[j] / (1 - pow(b2, s + 1));
                    w[j] = w[j] * (1 - lr * wd) - lr * mh / (sqrt(vh) + eps);
                }
            }
        }
        // Compare the change from the initial weights (the weights themselves would hide it).
        float *got = (float *)r.master[pi->group].p + pi->off;
        for (int64_t j = 0; j < n; j++)
            u[j] = got[j] - p[pi->group][pi->off + j], o[j] = w[j] - p[pi->group][pi->off + j];
        double err = rel_err_f64(u, o, n);
        worst[muon] = fmax(worst[muon], err), counted[muon]++;
        ASSERT_MSG(err < 1e-4, "%s (%s): update differs from fp64 by %.3g", pi->name, muon ? "muon" : "adamw", err);
        free(gr[0]), free(gr[1]), free(w), free(m1), free(v), free(u), free(o);
    }
    printf("     2 steps: %d Muon tensors within %.1e, %d AdamW tensors within %.1e of fp64\n", counted[1], worst[1],
           counted[0], worst[0]);
    ASSERT(counted[0] >= 8 && counted[1] >= 20);
    st_set_close(&g1), st_set_close(&g2);
    for (int g = 0; g < NGROUPS; g++) free(p[g]);
    run_free(&r);
}

TEST(muon_resume_bit_exact) {
    const char *d = make_muon_run();
    char out[1 << 16];
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set save_location=%s/a > /dev/null && "
                   "%s train %s/train.json --set save_location=%s/b --steps 3 > /dev/null && "
                   "%s train %s/train.json --set save_location=%s/b",
                   PITH_BIN, d, d, PITH_BIN, d, d, PITH_BIN, d, d) == 0);
    ASSERT_MSG(strstr(out, "resume: step 3"), "%s", out);
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "cd %s && cmp a/step-00000006/model.safetensors b/step-00000006/model.safetensors && "
                       "cmp a/step-00000006/optimizer.safetensors b/step-00000006/optimizer.safetensors && "
                       "sed 's/, .tokens_per_s.*//' a/metrics.jsonl > a.txt && sed 's/, .tokens_per_s.*//' "
                       "b/metrics.jsonl > b.txt && "
                       "cmp a.txt b.txt",
                       d) == 0,
               "%s", out);
    // Muon's state does not resume as AdamW's (nor the other way).
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set save_location=%s/b --set optimizer.type=adamw --set max_steps=8",
                   PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "run.json: train_config.optimizer.type: the checkpoint's optimizer state is muon's, the "
                           "config asks for adamw"),
               "%s", out);
}

// One reference made elsewhere: tests/muon/make_fixture.py computes two steps of every parameter class (2-D
// tall and wide, adjacent per-expert matrices, a 3-D expert stack per expert; AdamW for embedding, LM head,
// router, norms, biases, sinks) with PyTorch in float64 from the formula. pith's muon_step on one rank, in
// fp32, must land within 2e-5 of it (relative to each tensor's change), and classify every tensor the same way.
static void fixture_f64(const StFile *f, const char *what, const char *name, double *dst, int64_t n) {
    char key[160];
    snprintf(key, sizeof key, "%s/%s", what, name);
    const StTensor *t = st_find(f, key);
    ASSERT_MSG(t && t->dt == ST_F64 && t->numel == n, "%s: %s missing or not F64 of %lld", f->path, key, (long long)n);
    memcpy(dst, t->data, sizeof(double) * n);
}

TEST(muon_step_matches_pytorch_fp64_fixture) {
    StFile f;
    st_open_or_die(&f, "tests/muon/fixture.safetensors");
    ParamTable t = {0};
    for (int i = 0; i < f.n; i++) { // the fixture's parameters, in its (sorted) order, all in one group
        const StTensor *s = &f.t[i];
        if (strncmp(s->name, "init/", 5)) continue;
        params_add(&t, s->name + 5, GROUP_DENSE, INIT_ZEROS, s->nd, s->shape[0], s->nd > 1 ? s->shape[1] : 0,
                   s->nd > 2 ? s->shape[2] : 0);
    }
    ASSERT(t.n == 18);
    int64_t N = t.numel[GROUP_DENSE];
    Arena a = arena_create("muon fixture", DEV_CPU, 1 << 20);
    Muon mu;
    muon_setup(&mu, &t, &a);
    // One rank: the shard is the whole buffer and the gradient shard is model.g itself.
    Fsdp fs = {.numel = {N, 0}, .len = {N, 0}};
    Model m = {0};
    float *p = xmalloc(sizeof(float) * N), *g = xmalloc(sizeof(float) * N), *m1 = xcalloc(N, 4), *v = xcalloc(N, 4);
    double *x = xmalloc(sizeof(double) * N), *init = xmalloc(sizeof(double) * N), *want = xmalloc(sizeof(double) * N);
    Tensor master[NGROUPS] = {tf32_1(p, N), tf32_1(NULL, 0)}, grad[NGROUPS] = {tf32_1(g, N), tf32_1(NULL, 0)},
           mom1[NGROUPS] = {tf32_1(m1, N), tf32_1(NULL, 0)}, mom2[NGROUPS] = {tf32_1(v, N), tf32_1(NULL, 0)};
    m.g[GROUP_DENSE] = grad[GROUP_DENSE], m.g[GROUP_EXPERT] = grad[GROUP_EXPERT];
    for (int i = 0; i < t.n; i++) {
        const ParamInfo *pi = &t.p[i];
        char key[160];
        snprintf(key, sizeof key, "class/%s", pi->name);
        const char *cls = st_meta(&f, key);
        ASSERT_MSG(cls && !strcmp(cls, muon_param(pi->name, pi->nd) ? "muon" : "adamw"),
                   "%s: the fixture's class is %s", pi->name, cls ? cls : "missing");
        fixture_f64(&f, "init", pi->name, init + pi->off, params_numel(pi));
    }
    for (int64_t j = 0; j < N; j++) p[j] = (float)init[j]; // exact: the generator drew fp32 values
    TrainConfig c = {0};
    c.optimizer.momentum = 0.95, c.optimizer.weight_decay = 0.1, c.optimizer.eps = 1e-8;
    c.optimizer.betas[0] = 0.9, c.optimizer.betas[1] = 0.999;
    const double lrs[2] = {0.02, 0.015};
    ASSERT(!strcmp(st_meta(&f, "lrs"), "[0.02, 0.015]") && !strcmp(st_meta(&f, "weight_decay"), "0.1"));
    double worst[2] = {0, 0};
    for (int s = 1; s <= 2; s++) {
        char what[16];
        for (int i = 0; i < t.n; i++) {
            const ParamInfo *pi = &t.p[i];
            snprintf(what, sizeof what, "grad%d", s), fixture_f64(&f, what, pi->name, x + pi->off, params_numel(pi));
        }
        for (int64_t j = 0; j < N; j++) g[j] = (float)x[j];
        muon_step(&mu, &fs, &m, &c, lrs[s - 1], s, master, grad, mom1, mom2);
        for (int i = 0; i < t.n; i++) { // the change from the initial weights (the weights would hide it)
            const ParamInfo *pi = &t.p[i];
            int64_t n = params_numel(pi);
            snprintf(what, sizeof what, "step%d", s), fixture_f64(&f, what, pi->name, want + pi->off, n);
            for (int64_t j = pi->off; j < pi->off + n; j++) x[j] = p[j] - init[j], want[j] -= init[j];
            bool muon = muon_param(pi->name, pi->nd);
            double err = rel_err_f64(x + pi->off, want + pi->off, n);
            worst[muon] = fmax(worst[muon], err);
            ASSERT_MSG(err < 2e-5, "step %d, %s (%s): differs from the PyTorch fp64 fixture by %.3g", s, pi->name,
                       muon ? "muon" : "adamw", err);
        }
    }
    printf("     2 steps, 18 tensors: Muon within %.1e, AdamW within %.1e of PyTorch fp64 (%s, torch %s)\n", worst[1],
           worst[0], st_meta(&f, "device"), st_meta(&f, "torch"));
    free(p), free(g), free(m1), free(v), free(x), free(init), free(want);
    muon_free(&mu), arena_destroy(&a), free(t.p), st_close(&f);
}

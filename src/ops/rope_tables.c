// rope_tables.c — the RoPE cos/sin tables every family builds once (host code, fp32 like transformers' rotary
// embeddings, which stay fp32 even in fp64 models).
// Default: inv_freq_i = 1 / theta^(2i/rd), i < rd/2.
// YaRN (transformers' _compute_yarn_parameters, which DeepSeek-V2 and GPT-OSS both use):
//   cd(r) = rd·ln(orig / (2π·r)) / (2·ln theta)   the dim index that turns r times within orig positions
//   lo = max(cd(beta_fast), 0), hi = min(cd(beta_slow), rd − 1), floored/ceiled first when truncate
//   ramp_i = clamp((i − lo) / (hi − lo), 0, 1) (hi += 0.001 when lo == hi), extra_i = 1 − ramp_i
//   inv_freq_i = (1 / (factor·theta^(2i/rd)))·(1 − extra_i) + (1 / theta^(2i/rd))·extra_i
//   the tables are multiplied by the attention factor (ops.h: RopeSpec).
#include <math.h>

#include "ops/ops.h"

static double yarn_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * log(s) + 1.0; }

static double yarn_correction_dim(double rot, int rd, double theta, double orig) {
    return rd * log(orig / (rot * 2 * 3.14159265358979323846)) / (2 * log(theta));
}

void op_rope_tables(Tensor cos_t, Tensor sin_t, const RopeSpec *r) {
    int rd = r->rd, half = rd / 2;
    int64_t P = cos_t.n[0];
    CHECK(rd > 0 && rd % 2 == 0 && cos_t.dev == DEV_CPU && cos_t.dt == DT_F32 && sin_t.dt == DT_F32);
    CHECK(cos_t.n[1] == half && sin_t.n[0] == P && sin_t.n[1] == half);
    float *inv = xmalloc(half * sizeof(float)), f = 1.0f;
    for (int i = 0; i < half; i++) inv[i] = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)rd);
    if (r->yarn) {
        CHECK(r->factor > 0 && r->orig_max_pos > 0);
        double bf = r->beta_fast ? r->beta_fast : 32, bs = r->beta_slow ? r->beta_slow : 1;
        double lo = yarn_correction_dim(bf, rd, r->theta, r->orig_max_pos);
        double hi = yarn_correction_dim(bs, rd, r->theta, r->orig_max_pos);
        if (r->truncate) lo = floor(lo), hi = ceil(hi);
        lo = fmax(lo, 0), hi = fmin(hi, rd - 1);
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            float pf = powf((float)r->theta, (float)(2 * i) / (float)rd);
            float ramp = fminf(fmaxf(((float)i - (float)lo) / (float)(hi - lo), 0.0f), 1.0f), extra = 1.0f - ramp;
            inv[i] = 1.0f / ((float)r->factor * pf) * (1.0f - extra) + 1.0f / pf * extra;
        }
        double af = r->attention_factor;
        if (af == 0)
            af = r->mscale && r->mscale_all_dim
                     ? yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim)
                     : yarn_mscale(r->factor, 1);
        f = (float)af;
    }
    float *c = cos_t.p, *s = sin_t.p;
    for (int64_t p = 0; p < P; p++)
        for (int i = 0; i < half; i++) {
            float a = (float)p * inv[i];
            c[p * half + i] = cosf(a) * f; // f = 1 is exact: default tables are plain cos, sin
            s[p * half + i] = sinf(a) * f;
        }
    free(inv);
}

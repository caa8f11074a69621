// test_sft.c — supervised fine-tuning: token files with a loss mask (format 2) next to the old two-record ones,
// `pith tokenize --format prompt-completion` (the mask it writes, its errors), masked targets that change nothing,
// `pith eval --per-token` against the mean loss, and examples/sft end to end.
#include <math.h>

#include "base/bpe.h"
#include "base/npy.h"
#include "test.h"
#include "train/data.h"

#define DSV3 "data/tokenizers/deepseek_v3"
#define FIX "tests/hf/qwen3_moe"

static char out[1 << 16];

// A token file of the n uint32 tokens of tok, one document.
static void write_tokens(const char *path, const uint32_t *tok, int64_t n) {
    FILE *f = fopen(path, "wb");
    uint64_t end = (uint64_t)n;
    CHECK(f && npy_write_header(f, DT_U32, n) && fwrite(tok, 4, n, f) == (size_t)n);
    CHECK(npy_write_header(f, DT_U64, 1) && fwrite(&end, 8, 1, f) == 1 && !fclose(f));
}

// A two-record file reads as before (no label masked); the same file with a mask reads the same tokens and labels
// but −100 exactly where the mask says; a bad mask is an error naming the file and the record.
TEST(sft_token_file_mask_and_old_files) {
    const char *d = tiny_run("");
    char plain[300], masked[300];
    snprintf(plain, sizeof plain, "%s/data.bin", d), snprintf(masked, sizeof masked, "%s/m/m.bin", d);
    ASSERT(run_cmd(out, sizeof out, "mkdir -p %s/m && cp %s %s", d, plain, masked) == 0);
    token_file_mask(masked, 5);
    Dataset a, b;
    dataset_open(&a, plain, 16, 64, 1), dataset_open(&b, masked, 16, 64, 1);
    a.ordered = b.ordered = true;
    ASSERT(!a.files[0].mask && b.files[0].mask && a.total == b.total);
    int32_t ta[16], la[16], tb[16], lb[16];
    int64_t masked_n = 0;
    for (int64_t i = 0; i < a.total; i++) {
        dataset_sample(&a, i, ta, la), dataset_sample(&b, i, tb, lb);
        ASSERT(!memcmp(ta, tb, sizeof ta));
        for (int t = 0; t < 16; t++) {
            bool target = (i * 16 + t + 1) % 16 >= 5; // label t is token i·16 + t + 1 of the file
            ASSERT(la[t] >= 0 && lb[t] == (target ? la[t] : -100));
            masked_n += !target;
        }
    }
    ASSERT(masked_n == a.total * 5);
    dataset_close(&a), dataset_close(&b);
    // A mask value other than 0 or 1, and a mask of the wrong length.
    size_t n;
    char *bytes = file_read_all(masked, &n);
    bytes[n - 3] = 2;
    write_bytes(d, "bad/two.bin", bytes, n);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set dataset=%s/bad/two.bin --set run_dir=%s/r", PITH_BIN,
                   d, d, d) == 1);
    ASSERT_MSG(strstr(out, "two.bin: loss-mask record: value 2 at token"), "%s", out);
    NpyRecord tok, ends, mask;
    char err[300];
    ASSERT(npy_token_file_parse((uint8_t *)bytes, n, &tok, &ends, &mask, err, sizeof err) == false);
    FILE *f = fopen(write_bytes(d, "bad/short.bin", bytes, tok.record_len + ends.record_len), "ab");
    ASSERT(f && npy_write_header(f, DT_U8, 3) && fwrite("\1\1\1", 1, 3, f) == 3 && !fclose(f));
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set dataset=%s/bad/short.bin --set run_dir=%s/r",
                   PITH_BIN, d, d, d) == 1);
    ASSERT_MSG(strstr(out, "short.bin: loss-mask record: 3 values of dtype U8, expected 3000 uint8"), "%s", out);
    free(bytes);
}

// Four token files of one sample each (17 tokens: the last is a target only, never an input). With the last token
// masked, changing it changes neither the loss nor any gradient (bit for bit); unmasked, the same change moves the
// loss (the check can fail).
TEST(sft_masked_targets_contribute_nothing) {
    const char *d = tiny_run("");
    static const char *runs[] = {"masked", "masked_changed", "plain", "plain_changed"};
    char path[400], dump[4][400];
    double loss[4];
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < 4; k++) {
            uint32_t tok[17];
            for (int j = 0; j < 17; j++) tok[j] = (uint32_t)(rng_u64(7, k, j) % 64);
            if (r % 2) tok[16] = (tok[16] + 1 + k) % 64;
            snprintf(path, sizeof path, "%s/%s", d, runs[r]), mkdir_p(path);
            snprintf(path, sizeof path, "%s/%s/%d.bin", d, runs[r], k);
            write_tokens(path, tok, 17);
            if (r < 2) token_file_mask(path, 5); // tokens 0..4 and 16 are not targets
        }
        snprintf(dump[r], sizeof dump[r], "%s/g-%s", d, runs[r]);
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "%s train %s/train.json --set dataset=%s/%s --set max_steps=1 --set run_dir=%s/run-%s "
                           "--dump-grads %s",
                           PITH_BIN, d, d, runs[r], d, runs[r], dump[r]) == 0,
                   "%s", out);
        snprintf(path, sizeof path, "%s/run-%s", d, runs[r]);
        loss[r] = run_metric(path, 1, "loss");
    }
    const char *wn;
    ASSERT_MSG(loss[0] == loss[1], "masked: loss %.17g, changed %.17g", loss[0], loss[1]);
    ASSERT_MSG(grad_diff(dump[0], dump[1], &wn) == 0, "masked: the gradient of %s moved", wn);
    ASSERT_MSG(loss[2] != loss[3], "unmasked: the changed target left the loss at %.17g", loss[2]);
    ASSERT(loss[0] != loss[2]);
}

// pith eval --per-token: NaN exactly at the masked labels, and the printed loss is the mean of the others (their
// count the targets printed), with several micro-batches and a last one filled up.
TEST(sft_eval_per_token_mean) {
    const char *d = test_tmpdir();
    char data[300], npy[300];
    snprintf(data, sizeof data, "%s/tokens.bin", d), snprintf(npy, sizeof npy, "%s/pt.npy", d);
    ASSERT(run_cmd(out, sizeof out, "cp " FIX "/tokens.bin %s", data) == 0);
    token_file_mask(data, 5);
    int B = 4, S = 16;
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "%s eval --model " FIX " --data %s --seq 16 --batch 4 --micro-batch 3 --per-token %s", PITH_BIN,
                       data, npy) == 0,
               "%s", out);
    double want = atof(strstr(out, "loss ") + 5), sum = 0;
    float *v = npy_read_f32_2d(npy, B, S);
    int64_t n = 0;
    for (int i = 0; i < B; i++)
        for (int t = 0; t < S; t++) {
            bool target = (i * S + t + 1) % 16 >= 5;
            ASSERT_MSG(target == !isnan(v[i * S + t]), "sample %d label %d: %g", i, t, v[i * S + t]);
            if (!target) continue;
            ASSERT(v[i * S + t] > 0);
            sum += v[i * S + t], n++;
        }
    ASSERT_MSG(fabs(sum / n - want) <= 1e-6 * want, "mean of --per-token %.9g, loss %.9g", sum / n, want);
    ASSERT_MSG(n == B * 11 && strstr(out, "(44 targets)"), "%s", out);
    free(v);
}

// --format prompt-completion: per line one document, the prompt's ids (BOS first, as DeepSeek-V3 asks) masked, the
// completion's and EOS targets; the data reads the prompt's labels as −100. Bad lines and inputs are one-line errors
// naming file:line and the field.
TEST(sft_tokenize_prompt_completion) {
    ASSERT_MSG(path_exists(DSV3 "/tokenizer.json"), "tokenizer files are missing: run scripts/tokenizers.sh");
    const char *dir = test_tmpdir();
    char in[512], o[512], bin[600];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o, sizeof o, "%s/out", dir);
    write_text(in, "pairs.jsonl",
               "{\"prompt\": \"Hello\", \"completion\": \" world\", \"id\": 1}\n\n{\"completion\": \"x\", \"prompt\": "
               "\"\"}\n");
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "%s tokenize --tokenizer " DSV3 " --format prompt-completion --input %s/pairs.jsonl --output %s",
                       PITH_BIN, in, o) == 0 &&
                   strstr(out, "2 documents"),
               "%s", out);
    Bpe *tk = bpe_load(DSV3);
    BpeScratch *sc = bpe_scratch_new(tk);
    IdVec want = {0};
    uint8_t mask[64];
    static const char *pairs[2][2] = {{"Hello", " world"}, {"", "x"}};
    uint64_t ends[2];
    for (int i = 0; i < 2; i++) {
        size_t n0 = want.n;
        bpe_encode(tk, sc, pairs[i][0], strlen(pairs[i][0]), true, &want);
        memset(mask + n0, 0, want.n - n0), n0 = want.n;
        bpe_encode(tk, sc, pairs[i][1], strlen(pairs[i][1]), false, &want);
        idvec_push(&want, 1); // EOS <｜end▁of▁sentence｜>
        memset(mask + n0, 1, want.n - n0), ends[i] = want.n;
    }
    snprintf(bin, sizeof bin, "%s/pairs.jsonl.bin", o);
    size_t n;
    uint8_t *b = (uint8_t *)file_read_all(bin, &n);
    NpyRecord tok, en, mk;
    char err[300];
    ASSERT_MSG(b && npy_token_file_parse(b, n, &tok, &en, &mk, err, sizeof err), "%s", err);
    ASSERT(tok.dt == DT_U32 && tok.n == (int64_t)want.n && !memcmp(tok.data, want.p, 4 * want.n));
    ASSERT(en.n == 2 && !memcmp(en.data, ends, sizeof ends) && mk.n == tok.n && !memcmp(mk.data, mask, want.n));
    ASSERT(mask[0] == 0 && mask[1] == 0 && mask[2] == 1); // BOS "Hello" | " world" EOS
    Dataset ds;
    dataset_open(&ds, bin, (int)want.n - 1, bpe_num_ids(tk), 1);
    ds.ordered = true;
    int32_t t[64], l[64];
    dataset_sample(&ds, 0, t, l);
    for (size_t j = 1; j < want.n; j++) ASSERT(l[j - 1] == (mask[j] ? (int32_t)want.p[j] : -100));
    dataset_close(&ds), free(b), idvec_free(&want), bpe_scratch_free(sc), bpe_free(tk);
    write_text(in, "not_json.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\", \n");
    write_text(in, "no_prompt.jsonl", "{\"completion\": \"b\"}\n");
    write_text(in, "no_completion.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"prompt\": \"a\"}\n");
    write_text(in, "not_string.jsonl", "{\"prompt\": \"a\", \"completion\": [\"b\"]}\n");
    write_text(in, "doc.txt", "text\n");
    static const struct {
        const char *file, *extra, *msg;
    } cases[] = {
        {"not_json.jsonl", "", "not_json.jsonl:2: malformed JSON"},
        {"no_prompt.jsonl", "", "no_prompt.jsonl:1: no field \"prompt\""},
        {"no_completion.jsonl", "", "no_completion.jsonl:3: no field \"completion\""},
        {"not_string.jsonl", "", "not_string.jsonl:1: field \"completion\" is not a string"},
        {"doc.txt", "", "doc.txt: --format prompt-completion reads JSON lines"},
        {"no_prompt.jsonl", "--field body", "--field does not apply to --format prompt-completion"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run_cmd(out, sizeof out,
                         "%s tokenize --tokenizer " DSV3 " --format prompt-completion --input %s/%s --output %s %s",
                         PITH_BIN, in, cases[i].file, o, cases[i].extra);
        ASSERT_MSG(rc == 1 && strstr(out, cases[i].msg), "case %zu: exit %d, output: %s", i, rc, out);
        ASSERT_MSG(strchr(out, '\n') == out + strlen(out) - 1, "case %zu: more than one line: %s", i, out);
        snprintf(bin, sizeof bin, "%s/%s.bin", o, cases[i].file);
        ASSERT(!path_exists(bin));
    }
}

// examples/sft/run.sh in a copy of the example (its outputs under a temporary folder), fine-tuning 60 steps: the
// tokens carry a loss mask, the loss falls, and the per-token losses average to eval's loss.
TEST(sft_example_end_to_end) {
    const char *d = test_tmpdir();
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "mkdir -p %s/examples && cp -r examples/sft %s/examples/ && PITH=$(realpath %s) bash "
                       "%s/examples/sft/run.sh --set max_steps=60",
                       d, d, PITH_BIN, d) == 0,
               "%s", out);
    char path[400];
    snprintf(path, sizeof path, "%s/runs/sft", d);
    double first = run_metric(path, 1, "loss"), last = run_metric(path, 60, "loss");
    ASSERT_MSG(last < first / 2, "loss %.4g at step 1, %.4g at step 60", first, last);
    double want = atof(strstr(out, "\nloss ") + 6), sum = 0;
    snprintf(path, sizeof path, "%s/data/sft/per_token.npy", d);
    float *v = npy_read_f32_2d(path, 8, 64);
    int n = 0, masked = 0;
    for (int j = 0; j < 8 * 64; j++)
        if (isnan(v[j])) masked++;
        else sum += v[j], n++;
    ASSERT_MSG(masked > n && fabs(sum / n - want) <= 1e-6 * want, "%d targets, %d masked: mean %.9g, loss %.9g", n,
               masked, sum / n, want);
    free(v);
}

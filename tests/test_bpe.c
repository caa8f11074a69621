// test_bpe.c — the BPE tokenizer against golden ids from Hugging Face `tokenizers` (tests/golden/, made by
// scripts/golden_ids.mjs) for Qwen3, GPT-OSS (o200k) and DeepSeek-V3, round trips, both merge paths, long runs of one
// character, and invalid UTF-8. The tokenizer files come from scripts/tokenizers.sh (run by scripts/deps.sh).
#include <jansson.h>
#include <utf8proc.h>

#include "base/bpe.h"
#include "test.h"

static const char *tok_names[3] = {"qwen3", "gptoss", "deepseek_v3"};

// Tokenizers are loaded once per test binary (gptoss's tokenizer.json is 28 MB).
static Bpe *tok_get(int k) {
    static Bpe *loaded[3];
    char path[256];
    snprintf(path, sizeof path, "data/tokenizers/%s/tokenizer.json", tok_names[k]);
    ASSERT_MSG(path_exists(path), "%s is missing: run scripts/tokenizers.sh (scripts/deps.sh runs it)", path);
    if (!loaded[k]) loaded[k] = bpe_load(path);
    return loaded[k];
}

static json_t *golden_texts(void) {
    static json_t *texts;
    json_error_t e;
    if (!texts) texts = json_load_file("tests/golden/texts.json", JSON_ALLOW_NUL, &e);
    ASSERT_MSG(json_is_array(texts) && json_array_size(texts) > 30, "tests/golden/texts.json: %s", e.text);
    return texts;
}

// Encodes every golden text and compares with the golden ids; returns how many texts were compared.
static size_t golden_check(int k) {
    Bpe *t = tok_get(k);
    json_t *texts = golden_texts(), *gold;
    char path[256];
    json_error_t e;
    snprintf(path, sizeof path, "tests/golden/%s.json", tok_names[k]);
    gold = json_load_file(path, 0, &e);
    json_t *ids = json_object_get(gold, "ids");
    ASSERT_MSG(json_array_size(ids) == json_array_size(texts), "%s: %zu id lists for %zu texts", path,
               json_array_size(ids), json_array_size(texts));
    BpeScratch *s = bpe_scratch_new(t);
    for (size_t i = 0; i < json_array_size(texts); i++) {
        json_t *x = json_array_get(texts, i), *want = json_array_get(ids, i);
        IdVec v = {0};
        bpe_encode(t, s, json_string_value(x), json_string_length(x), false, &v);
        size_t j = 0;
        while (j < v.n && j < json_array_size(want) && v.p[j] == json_integer_value(json_array_get(want, j))) j++;
        ASSERT_MSG(j == v.n && j == json_array_size(want),
                   "%s text %zu: %zu ids, want %zu; first difference at %zu (got %lld, want %lld)", tok_names[k], i,
                   v.n, json_array_size(want), j, j < v.n ? (long long)v.p[j] : -1LL,
                   j < json_array_size(want) ? (long long)json_integer_value(json_array_get(want, j)) : -1LL);
        idvec_free(&v);
    }
    bpe_scratch_free(s);
    json_decref(gold);
    return json_array_size(texts);
}

TEST(bpe_golden_qwen3) { ASSERT(golden_check(0) > 30); }
TEST(bpe_golden_gptoss) { ASSERT(golden_check(1) > 30); }
TEST(bpe_golden_deepseek_v3) { ASSERT(golden_check(2) > 30); }

// The heap path (every word) and the linear-scan path (every word) give the golden ids; so does splitting ASCII
// text with the Unicode regexes only.
TEST(bpe_paths_agree) {
    size_t keep = bpe_heap_min_len;
    for (int k = 0; k < 3; k++) {
        bpe_heap_min_len = 2, golden_check(k);
        bpe_heap_min_len = SIZE_MAX, golden_check(k);
    }
    bpe_heap_min_len = keep;
    bpe_ascii_regex = false;
    for (int k = 0; k < 3; k++) golden_check(k);
    bpe_ascii_regex = true;
}

// The ASCII copies of the split regexes give the same ids as the Unicode ones on random ASCII text.
TEST(bpe_ascii_regex_agrees) {
    static const char *frags[] = {"a",     "Z",     "the",       " The", "'s",   "'S", "'ll", "'Re",  "'",     "\"",
                                  " ",     "  ",    "\t",        "\n",   "\r\n", "\r", "\v",  "\f",   "0",     "12",
                                  "345",   "6789",  ".",         ",",    "!",    "?",  "-",   "_",    "/",     "\\",
                                  "(",     ")",     "[",         "{",    "<",    "|",  "#",   "@",    "$",     "%",
                                  "&",     "*",     "+",         "=",    "~",    "`",  "^",   "\x01", "\x1f",  "\x7f",
                                  "don't", "HELLO", "camelCase", "x1",   "    ", ":)", "a-b", "...",  "\n\n  "};
    Rng r = rng_seeded(5, 0);
    char text[1024];
    for (int k = 0; k < 3; k++) {
        Bpe *t = tok_get(k);
        BpeScratch *s = bpe_scratch_new(t);
        for (int i = 0; i < 4000; i++) {
            size_t n = 0;
            for (int j = 0, nj = 1 + (int)rng_below(&r, 30); j < nj; j++)
                n += (size_t)sprintf(text + n, "%s", frags[rng_below(&r, sizeof frags / sizeof *frags)]);
            IdVec a = {0}, b = {0};
            bpe_ascii_regex = true, bpe_encode(t, s, text, n, false, &a);
            bpe_ascii_regex = false, bpe_encode(t, s, text, n, false, &b);
            bpe_ascii_regex = true;
            ASSERT_MSG(a.n == b.n && !memcmp(a.p, b.p, 4 * a.n), "%s: ASCII and Unicode regexes differ on '%s'",
                       tok_names[k], text);
            idvec_free(&a), idvec_free(&b);
        }
        bpe_scratch_free(s);
    }
}

// decode(encode(x)) == x, or normalize(x) for a tokenizer with a normalizer (Qwen3: NFC).
TEST(bpe_roundtrip) {
    json_t *texts = golden_texts();
    for (int k = 0; k < 3; k++) {
        Bpe *t = tok_get(k);
        BpeScratch *s = bpe_scratch_new(t);
        for (size_t i = 0; i < json_array_size(texts); i++) {
            const char *x = json_string_value(json_array_get(texts, i));
            size_t n = strlen(x), nn, nd;
            char *want = bpe_normalize(t, x, n, &nn);
            IdVec v = {0};
            bpe_encode(t, s, x, n, false, &v);
            char *got = bpe_decode(t, v.p, v.n, &nd);
            ASSERT_MSG(nd == nn && !memcmp(got, want, nn), "%s text %zu: decode(encode(x)) = '%s', want '%s'",
                       tok_names[k], i, got, want);
            free(got), free(want), idvec_free(&v);
        }
        bpe_scratch_free(s);
    }
}

// tokenizer_config.json asks DeepSeek-V3 for BOS (add_bos_token); Qwen3 and GPT-OSS add nothing.
TEST(bpe_special_template) {
    for (int k = 0; k < 3; k++) {
        Bpe *t = tok_get(k);
        BpeScratch *s = bpe_scratch_new(t);
        IdVec a = {0}, b = {0};
        bpe_encode(t, s, "Hello world", 11, false, &a);
        bpe_encode(t, s, "Hello world", 11, true, &b);
        ASSERT(a.n == 2);
        if (k == 2) ASSERT(b.n == 3 && b.p[0] == 0 && b.p[1] == a.p[0] && b.p[2] == a.p[1]);
        else ASSERT(b.n == 2 && b.p[0] == a.p[0]);
        idvec_free(&a), idvec_free(&b), bpe_scratch_free(s);
    }
    ASSERT(!strcmp(bpe_config_token(tok_get(0), "eos_token"), "<|im_end|>") &&
           bpe_token_to_id(tok_get(0), "<|im_end|>") == 151645);
    ASSERT(!strcmp(bpe_config_token(tok_get(1), "eos_token"), "<|return|>") &&
           bpe_token_to_id(tok_get(1), "<|return|>") == 200002);
    ASSERT(bpe_token_to_id(tok_get(2), bpe_config_token(tok_get(2), "eos_token")) == 1);
    ASSERT(bpe_token_to_id(tok_get(0), "Hello") == 9707 && bpe_token_to_id(tok_get(0), "no such token!!") == -1);
}

// A 1 MB run of one character is a single word (or a single regex match): it round-trips, and in linear time
// (about 0.3 s here; quadratic merging would take minutes and hold up the suite, which is how it would show:
// the time is printed when above a second, never asserted).
TEST(bpe_long_runs) {
    size_t n = 1 << 20;
    char *buf = xmalloc(n + 2);
    const char fills[] = {'a', ' ', '\n', '7'};
    for (int k = 0; k < 3; k++) {
        Bpe *t = tok_get(k);
        BpeScratch *s = bpe_scratch_new(t);
        for (int f = 0; f < 4; f++) {
            memset(buf, fills[f], n);
            buf[n] = 'x';
            double t0 = now_seconds();
            IdVec v = {0};
            bpe_encode(t, s, buf, n + 1, false, &v);
            double dt = now_seconds() - t0;
            size_t nd;
            char *back = bpe_decode(t, v.p, v.n, &nd);
            ASSERT_MSG(nd == n + 1 && !memcmp(back, buf, n + 1), "%s: run of '%c' does not round-trip", tok_names[k],
                       fills[f]);
            if (dt > 1.0) // said, not asserted: speed belongs to bench/tokenize, a busy machine is no failure
                printf("     %s: 1 MB run of '%c' took %.2f s\n", tok_names[k], fills[f], dt);
            ASSERT(v.n > 0 && v.n <= n + 1);
            free(back), idvec_free(&v);
        }
        bpe_scratch_free(s);
    }
    free(buf);
}

// Invalid UTF-8 becomes U+FFFD, one per maximal invalid subpart (Rust's from_utf8_lossy, Python's errors='replace').
TEST(bpe_invalid_utf8) {
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"ok", NULL},
        {"a\xC3(b", "a\xEF\xBF\xBD(b"},
        {"\xE2\x82", "\xEF\xBF\xBD"},
        {"\xF0\x9F\x98x", "\xEF\xBF\xBDx"},
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, // a surrogate: three subparts
        {"\xFF\xFE", "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},                                 // overlong
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, // above U+10FFFF
        {"caf\xC3\xA9 \xF0\x9F\x98\x80", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n;
        char *r = bpe_utf8_repair(cases[i].in, strlen(cases[i].in), &n);
        if (!cases[i].out) ASSERT_MSG(!r, "case %zu: valid text was changed", i);
        else ASSERT_MSG(r && n == strlen(cases[i].out) && !memcmp(r, cases[i].out, n), "case %zu: wrong repair", i);
        free(r);
    }
    Bpe *t = tok_get(0);
    BpeScratch *s = bpe_scratch_new(t);
    IdVec a = {0}, b = {0};
    bpe_encode(t, s, "x\xFFy\xE2\x82", 5, false, &a);
    bpe_encode(t, s, "x\xEF\xBF\xBDy\xEF\xBF\xBD", 8, false, &b);
    ASSERT(a.n == b.n && a.n > 0 && !memcmp(a.p, b.p, a.n * 4));
    idvec_free(&a), idvec_free(&b), bpe_scratch_free(s);
}

// The NFC quick check (text that NFC cannot change is not normalized): every code point alone, and random strings
// of 2-4 code points drawn from ranges where composition happens, against utf8proc's NFC.
TEST(bpe_nfc_quick_check) {
    Bpe *t = tok_get(0); // Qwen3: NFC
    ASSERT(bpe_has_normalizer(t));
    static const int32_t ranges[][2] = {{0x20, 0x7F},       {0xC0, 0x17F},      {0x300, 0x36F},   {0x1100, 0x11FF},
                                        {0xAC00, 0xAC40},   {0x3040, 0x30FF},   {0x0900, 0x097F}, {0x0B00, 0x0BFF},
                                        {0x0CBF, 0x0CD6},   {0x0F40, 0x0F80},   {0x1E00, 0x1EFF}, {0x2100, 0x213F},
                                        {0x1D15E, 0x1D164}, {0x1F600, 0x1F64F}, {0x4E00, 0x4E20}};
    Rng r = rng_seeded(3, 0);
    for (int64_t i = 0; i < 0x110000 + 300000; i++) {
        uint8_t buf[32];
        size_t n = 0;
        if (i < 0x110000) {
            if (i >= 0xD800 && i < 0xE000) continue;
            n = (size_t)utf8proc_encode_char((int32_t)i, buf);
        } else
            for (int k = 0, nk = 2 + (int)rng_below(&r, 3); k < nk; k++) {
                const int32_t *rg = ranges[rng_below(&r, sizeof ranges / sizeof *ranges)];
                n += (size_t)utf8proc_encode_char(rg[0] + (int32_t)rng_below(&r, (uint64_t)(rg[1] - rg[0] + 1)),
                                                  buf + n);
            }
        uint8_t *want = NULL;
        utf8proc_ssize_t wn = utf8proc_map(buf, (utf8proc_ssize_t)n, &want, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        size_t gn;
        char *got = bpe_normalize(t, (const char *)buf, n, &gn);
        ASSERT_MSG(wn >= 0 && (size_t)wn == gn && !memcmp(got, want, gn),
                   "NFC differs for text %lld (first code point U+%04X)", (long long)i,
                   (unsigned)(i < 0x110000 ? i : 0));
        free(got), free(want);
    }
}

// test_safetensors.c — safetensors round trips (single and sharded), every corrupt-input error, and the
// bf16/fp16 conversions (exhaustive over 16-bit patterns, random fp32 against a nearest-value reference).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/half.h"
#include "base/json.h"
#include "base/safetensors.h"
#include "test.h"

static char st_dir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    path_join(p, 512, st_dir, name);
    return p;
}

// A file image: u64 header length, header text (unpadded), data.
static size_t make_image(uint8_t *out, uint64_t hlen, const char *header, const void *data, size_t dlen) {
    size_t n = strlen(header);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(out + 8, header, n);
    if (dlen) memcpy(out + 8 + n, data, dlen);
    return 8 + n + dlen;
}

// Opens the image both from a file (mmap) and from memory; both must fail with the same one-line message that
// names the file and contains `want`.
static void expect_bad_image(const uint8_t *img, size_t n, const char *want) {
    const char *path = tpath("bad.safetensors");
    write_bytes(NULL, path, img, n);
    char err[1024] = "", err2[1024] = "";
    StFile f, g;
    ASSERT_MSG(!st_open(&f, path, err, sizeof err), "opened a bad file, expected '%s'", want);
    ASSERT_MSG(strstr(err, want) && !strncmp(err, path, strlen(path)) && !strchr(err, '\n'),
               "error '%s', expected '%s'", err, want);
    ASSERT(f.n == 0 && f.t == NULL && f.header == NULL);
    ASSERT(!st_parse_buffer(&g, img, n, path, err2, sizeof err2));
    ASSERT_MSG(!strcmp(err, err2), "'%s' vs '%s'", err, err2);
}

static void expect_bad(const char *header, size_t dlen, const char *want) {
    static uint8_t img[1 << 12];
    uint8_t data[256] = {0};
    CHECK(dlen <= sizeof data);
    expect_bad_image(img, make_image(img, strlen(header), header, data, dlen), want);
}

// Runs fn in a child with stderr captured; the child must die (exit 1) with a message containing want.
static void expect_die(void (*fn)(void), const char *want) {
    const char *log = tpath("die.log");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CHECK(freopen(log, "w", stderr));
        fn();
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    char *msg = file_read_all(log, NULL);
    ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1, "child did not die");
    ASSERT_MSG(msg && strstr(msg, want), "message '%s', expected '%s'", msg ? msg : "", want);
    free(msg);
}

static void fresh_dir(void) { snprintf(st_dir, sizeof st_dir, "%s", test_tmpdir()); }

TEST(safetensors_roundtrip) {
    fresh_dir();
    float a[12], b[7], c = 3.25f, e[1];
    fill_normal(a, 12, 1.0f);
    fill_normal(b, 4, 1.0f);
    b[4] = f32_from_bits(0x3f808000), b[5] = f32_from_bits(0x7fc00123), b[6] = -INFINITY; // a tie, a NaN, -inf
    uint8_t u8[5] = {0, 1, 2, 254, 255};
    uint16_t raw_bf16[4] = {0x3f80, 0x0001, 0xff80, 0x7fc1};
    double f64[2] = {1.0 / 3, -2.5};
    StWriter w;
    st_writer_init(&w);
    st_writer_meta(&w, "format", "pt");
    st_writer_meta(&w, "note", "päth ✓");
    st_writer_add_f32(&w, "z.a", ST_F32, 2, (int64_t[]){3, 4}, a);
    st_writer_add_f32(&w, "b16", ST_BF16, 1, (int64_t[]){7}, b);
    st_writer_add_f32(&w, "half", ST_F16, 1, (int64_t[]){7}, b);
    st_writer_add_f32(&w, "scalar", ST_F32, 0, NULL, &c);
    st_writer_add_f32(&w, "empty", ST_BF16, 2, (int64_t[]){0, 3}, e);
    st_writer_add_raw(&w, "mask", ST_U8, 1, (int64_t[]){5}, u8);
    st_writer_add_raw(&w, "rawbf", ST_BF16, 2, (int64_t[]){2, 2}, raw_bf16);
    st_writer_add_raw(&w, "f64", ST_F64, 1, (int64_t[]){2}, f64);
    const char *p1 = tpath("one.safetensors");
    st_writer_write(&w, p1);
    ASSERT(!path_exists(tpath("one.safetensors.tmp")));

    StFile f;
    st_open_or_die(&f, p1);
    ASSERT(f.n == 8);
    for (int i = 1; i < f.n; i++) ASSERT(strcmp(f.t[i - 1].name, f.t[i].name) < 0);
    uint64_t hlen;
    memcpy(&hlen, f.map, 8);
    ASSERT(hlen % 8 == 0 && ((const char *)f.map)[8] == '{' && ((const char *)f.map)[8 + hlen - 1] == ' ');
    ASSERT(!strcmp(st_meta(&f, "format"), "pt") && !strcmp(st_meta(&f, "note"), "päth ✓") && !st_meta(&f, "x"));

    const StTensor *t = st_find(&f, "z.a");
    ASSERT(t && t->dt == ST_F32 && t->nd == 2 && t->shape[0] == 3 && t->shape[1] == 4 && t->bytes == 48);
    ASSERT(!memcmp(t->data, a, 48));
    st_check_shape(t, 2, (int64_t[]){3, 4});
    float got[12];
    st_read_f32(t, got);
    ASSERT(!memcmp(got, a, 48));
    t = st_find(&f, "b16");
    ASSERT(t && t->dt == ST_BF16 && t->bytes == 14);
    st_read_f32(t, got);
    for (int i = 0; i < 7; i++) {
        uint16_t h;
        memcpy(&h, (const char *)t->data + 2 * i, 2);
        ASSERT(h == f32_to_bf16(b[i]));
        ASSERT(f32_bits(got[i]) == f32_bits(bf16_to_f32(f32_to_bf16(b[i]))));
    }
    ASSERT(f32_bits(got[4]) == 0x3f800000 && isnan(got[5]) && got[6] == -INFINITY);
    t = st_find(&f, "half");
    st_read_f32(t, got);
    for (int i = 0; i < 7; i++) ASSERT(f32_bits(got[i]) == f32_bits(f16_to_f32(f32_to_f16(b[i]))));
    t = st_find(&f, "scalar");
    ASSERT(t && t->nd == 0 && t->numel == 1 && t->bytes == 4);
    st_read_f32(t, got);
    ASSERT(got[0] == 3.25f);
    t = st_find(&f, "empty");
    ASSERT(t && t->nd == 2 && t->shape[0] == 0 && t->numel == 0 && t->bytes == 0);
    st_read_f32(t, got);
    t = st_find(&f, "mask");
    ASSERT(t && t->dt == ST_U8 && !memcmp(t->data, u8, 5));
    t = st_find(&f, "rawbf");
    ASSERT(t && !memcmp(t->data, raw_bf16, 8));
    t = st_find(&f, "f64");
    st_read_f32(t, got);
    ASSERT(got[0] == (float)(1.0 / 3) && got[1] == -2.5f);
    ASSERT(!st_find(&f, "nope"));

    // Raw pass-through of every tensor reproduces the file byte for byte.
    StWriter w2;
    st_writer_init(&w2);
    for (int i = 0; i < f.n; i++) st_writer_add_raw(&w2, f.t[i].name, f.t[i].dt, f.t[i].nd, f.t[i].shape, f.t[i].data);
    st_writer_meta(&w2, "format", "pt");
    st_writer_meta(&w2, "note", "päth ✓");
    st_writer_write(&w2, tpath("two.safetensors"));
    size_t n1, n2;
    char *b1 = file_read_all(p1, &n1), *b2 = file_read_all(tpath("two.safetensors"), &n2);
    ASSERT(n1 == n2 && !memcmp(b1, b2, n1));
    free(b1), free(b2);
    st_writer_free(&w2);
    st_close(&f);
    st_writer_free(&w);

    // An empty writer gives a valid file with no tensors.
    st_writer_init(&w);
    st_writer_write(&w, tpath("empty.safetensors"));
    st_open_or_die(&f, tpath("empty.safetensors"));
    ASSERT(f.n == 0 && !f.metadata && !st_find(&f, "x"));
    st_close(&f);
}

TEST(safetensors_sharded) {
    fresh_dir();
    enum { N = 9 };
    static float data[N][300];
    char names[N][32];
    StWriter w;
    st_writer_init(&w);
    st_writer_meta(&w, "format", "pt");
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        int64_t n = i == 4 ? 300 : 10 * (i + 1); // tensor 4 (600 bytes as bf16) is larger than a shard
        fill_normal(data[i], n, 1.0f);
        snprintf(names[i], sizeof names[i], "model.layers.%d.w", N - i);
        st_writer_add_f32(&w, names[i], i % 2 ? ST_F32 : ST_BF16, 1, &n, data[i]);
        total += (size_t)n * (i % 2 ? 4 : 2);
    }
    char dir[512];
    path_join(dir, sizeof dir, st_dir, "out");
    int ns = st_writer_write_sharded(&w, dir, 256);
    ASSERT(ns >= 4);
    char p[600], want[64];
    snprintf(want, sizeof want, "model-%05d-of-%05d.safetensors", ns, ns);
    path_join(p, sizeof p, dir, want);
    ASSERT(path_exists(p) && !path_exists(tpath("out/model.safetensors")));
    json_t *idx = json_load_or_die(tpath("out/model.safetensors.index.json"));
    ASSERT(json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) == (json_int_t)total);
    ASSERT(json_object_size(json_object_get(idx, "weight_map")) == N);
    snprintf(want, sizeof want, "model-00001-of-%05d.safetensors", ns);
    ASSERT(!strcmp(json_string_value(json_object_get(json_object_get(idx, "weight_map"), names[0])), want));
    json_decref(idx);

    // Read back through the directory, the index file, and compare with a single-file write.
    for (int how = 0; how < 3; how++) {
        StSet s;
        if (how == 2) ASSERT(st_writer_write_sharded(&w, tpath("single"), 1 << 20) == 1);
        st_set_open_or_die(&s, how == 0 ? dir : how == 1 ? tpath("out/model.safetensors.index.json") : tpath("single"));
        ASSERT(s.n == N && s.nfiles == (how == 2 ? 1 : ns));
        for (int i = 0; i < N; i++) {
            const StTensor *t = st_set_find(&s, names[i]);
            ASSERT(t && t->numel == (i == 4 ? 300 : 10 * (i + 1)));
            float got[300];
            st_read_f32(t, got);
            for (int j = 0; j < t->numel; j++)
                ASSERT(f32_bits(got[j]) == f32_bits(i % 2 ? data[i][j] : bf16_to_f32(f32_to_bf16(data[i][j]))));
        }
        ASSERT(!st_set_find(&s, "model.layers.0.w"));
        st_set_close(&s);
    }
    // A plain file path opens as a set of one.
    StSet s;
    st_set_open_or_die(&s, tpath("single/model.safetensors"));
    ASSERT(s.n == N && s.nfiles == 1);
    st_set_close(&s);
    st_writer_free(&w);
}

TEST(safetensors_corrupt) {
    fresh_dir();
    uint8_t img[128];
    const char *ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t n = make_image(img, strlen(ok), ok, "abcdefgh", 8);
    StFile f;
    ASSERT(st_parse_buffer(&f, img, n, "ok", NULL, 0)); // the control case parses
    st_close(&f);
    expect_bad_image(img, 0, "file is 0 bytes, too short");
    expect_bad_image(img, 5, "file is 5 bytes, too short");
    expect_bad_image(img, 20, "header length 54 but only 12 bytes follow it (truncated file?)");
    expect_bad_image(img, n - 3, "tensor 'x': data_offsets [0, 8] out of range (data is 5 bytes)");
    make_image(img, 200000000, ok, NULL, 0);
    expect_bad_image(img, n, "header length 200000000 exceeds the limit");
    make_image(img, 1000, ok, NULL, 0);
    expect_bad_image(img, n, "header length 1000 but only");

    expect_bad("{\"x\": ", 0, "header is not valid JSON");
    expect_bad("{\"x\": 1} trailing", 0, "header is not valid JSON");
    expect_bad("[1, 2]", 0, "header is not a JSON object");
    expect_bad("\"str\"", 0, "header is not valid JSON"); // jansson rejects a bare top-level string
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"x\":{}}", 4, "duplicate object key");
    expect_bad("{\"x.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 8,
               "tensor 'x.weight': data_offsets [0, 12] out of range (data is 8 bytes)");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
               "data_offsets [8, 4] out of range");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
               "\"data_offsets\":[4,12]}}",
               12, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' (which ends at 8)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],"
               "\"data_offsets\":[8,12]}}",
               12, "tensor 'b': data_offsets [8, 12] leave bytes [4, 8) of the data region unused");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
               "data region is 12 bytes but the tensors cover only 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8");
    expect_bad("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': unknown dtype \"F31\"");
    expect_bad("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': dtype missing or not a string");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': shape[0] is not a non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1, 2.0],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': shape[1] is not a non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': shape missing or not an array");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
               "shape has 9 dimensions (at most 8)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': shape is too large");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
               "tensor 'a': data_offsets missing or not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8,
               "data_offsets missing or not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor 'a': data_offsets missing");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
               "tensor 'a': unknown field 'x'");
    expect_bad("{\"a\":[1]}", 8, "tensor 'a': expected an object");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ 'k' is not a string");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
    expect_bad("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\","
               "\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, "header is not valid JSON"); // jansson refuses NUL in keys without JSON_ALLOW_NUL

    char err[1024];
    ASSERT(!st_open(&f, tpath("missing.safetensors"), err, sizeof err) &&
           strstr(err, "missing.safetensors: cannot open: No such file"));
    ASSERT(!st_open(&f, st_dir, err, sizeof err) && strstr(err, "not a regular file"));
}

static StFile die_file;
static void die_read_int(void) {
    float x[2];
    st_read_f32(st_find(&die_file, "i"), x);
}
static void die_shape(void) { st_check_shape(st_find(&die_file, "i"), 2, (int64_t[]){1, 2}); }
static void die_open(void) {
    StFile f;
    st_open_or_die(&f, tpath("nothing.safetensors"));
}
static void die_set_open(void) {
    StSet s;
    st_set_open_or_die(&s, tpath("nothing"));
}

TEST(safetensors_die_messages) {
    fresh_dir();
    int32_t iv[2] = {1, 2};
    StWriter w;
    st_writer_init(&w);
    st_writer_add_raw(&w, "i", ST_I32, 1, (int64_t[]){2}, iv);
    st_writer_write(&w, tpath("i.safetensors"));
    st_writer_free(&w);
    st_open_or_die(&die_file, tpath("i.safetensors"));
    expect_die(die_read_int, "i.safetensors: tensor 'i': dtype I32 cannot be read as floating point");
    expect_die(die_shape, "i.safetensors: tensor 'i': shape [2], expected [1, 2]");
    expect_die(die_open, "pith: error: ");
    expect_die(die_set_open, "nothing: cannot open: No such file");
    st_close(&die_file);
}

// Two shards, a and (b, c); then the index is rewritten to break it in each way.
TEST(safetensors_index_errors) {
    fresh_dir();
    float x[4] = {1, 2, 3, 4};
    StWriter w;
    st_writer_init(&w);
    st_writer_add_f32(&w, "a", ST_F32, 1, (int64_t[]){4}, x);
    st_writer_add_f32(&w, "b", ST_F32, 1, (int64_t[]){2}, x);
    st_writer_add_f32(&w, "c", ST_F32, 1, (int64_t[]){2}, x);
    char dir[512];
    path_join(dir, sizeof dir, st_dir, "ck");
    ASSERT(st_writer_write_sharded(&w, dir, 16) == 2);
    st_writer_free(&w);
    const char *idx = tpath("ck/model.safetensors.index.json");
    struct {
        const char *index, *want;
    } cases[] = {
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00003-of-00002.safetensors\"}}",
         "model.safetensors.index.json: shard 'model-00003-of-00002.safetensors' (holding tensor 'b') does not exist"},
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00002-of-00002.safetensors\", "
         "\"c\": \"model-00002-of-00002.safetensors\", \"d\": \"model-00002-of-00002.safetensors\"}}",
         "weight_map puts tensor 'd' in shard 'model-00002-of-00002.safetensors', which has no such tensor"},
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\"}}",
         "weight_map puts tensor 'b' in shard 'model-00001-of-00002.safetensors', which has no such tensor"},
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00002-of-00002.safetensors\"}}",
         "tensor 'c' in shard 'model-00002-of-00002.safetensors' is missing from weight_map"},
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": 2}}",
         "weight_map: tensor 'b': shard is not a string"},
        {"{\"metadata\": {}}", "weight_map missing or not an object"},
        {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", "duplicate object key"},
        {"{\"weight_map\": ", "invalid JSON"},
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00002-of-00002.safetensors\", "
         "\"c\": \"model-00002-of-00002.safetensors\"}}",
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_bytes(NULL, idx, cases[i].index, strlen(cases[i].index));
        StSet s;
        char err[1024] = "";
        bool ok = st_set_open(&s, dir, err, sizeof err);
        if (!cases[i].want) {
            ASSERT_MSG(ok && s.n == 3 && st_set_find(&s, "a") && st_set_find(&s, "c"), "%s", err);
            st_set_close(&s);
            continue;
        }
        ASSERT_MSG(!ok && strstr(err, cases[i].want) && strstr(err, idx) == err, "case %zu: '%s', expected '%s'", i,
                   err, cases[i].want);
        ASSERT(s.n == 0 && s.nfiles == 0 && s.files == NULL);
    }
    // A tensor in two shards: the copy weight_map does not point at is reported.
    StWriter w3;
    st_writer_init(&w3);
    st_writer_add_f32(&w3, "a", ST_F32, 1, (int64_t[]){1}, x);
    st_writer_add_f32(&w3, "b", ST_F32, 1, (int64_t[]){2}, x);
    st_writer_add_f32(&w3, "c", ST_F32, 1, (int64_t[]){2}, x);
    st_writer_write(&w3, tpath("ck/model-00002-of-00002.safetensors"));
    st_writer_free(&w3);
    StSet s;
    char err[1024];
    ASSERT(!st_set_open(&s, dir, err, sizeof err) &&
           strstr(err, "tensor 'a' in shard 'model-00002-of-00002.safetensors' is mapped to another shard"));
    ASSERT(!st_set_open(&s, tpath("ck/none.index.json"), err, sizeof err) &&
           strstr(err, "ck/none.index.json: no such file"));
    // A corrupt shard is reported by its own path.
    write_bytes(NULL, tpath("ck/model-00002-of-00002.safetensors"), "xx", 2);
    ASSERT(!st_set_open(&s, dir, err, sizeof err) && strstr(err, "model-00002-of-00002.safetensors: file is 2 bytes"));
}

// Reference narrowing: the nearest of the two representable neighbours of |x|, ties to the even pattern.
// val(h) gives the value of pattern h for positive h, with the first overflow pattern valued as if the exponent
// range went on (2^128 for bf16, 2^16 for fp16), as IEEE rounding prescribes.
static uint16_t ref_round(double ax, uint16_t lo, double (*val)(uint16_t)) {
    double dl = ax - val(lo), dh = val(lo + 1) - ax;
    return dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1 ? lo + 1 : lo);
}
static double val_bf16(uint16_t h) { return h == 0x7f80 ? ldexp(1, 128) : bf16_to_f32(h); }
static double val_f16(uint16_t h) { return h == 0x7c00 ? 65536.0 : f16_to_f32(h); }

TEST(safetensors_half_bf16) {
    // Chosen patterns: ties go to the even mantissa, just-above/below go to the nearest.
    struct {
        uint32_t f;
        uint16_t h;
    } cases[] = {
        {0x3f808000, 0x3f80}, {0x3f818000, 0x3f82}, {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80}, {0xbf808000, 0xbf80},
        {0xbf818000, 0xbf82}, {0x3f7fffff, 0x3f80}, {0x7f7fffff, 0x7f80}, {0x7f7f7fff, 0x7f7f}, {0x7f7f8000, 0x7f80},
        {0x00008000, 0x0000}, {0x00018000, 0x0002}, {0x80008001, 0x8001}, {0x80000000, 0x8000}, {0x7f800000, 0x7f80},
        {0xff800000, 0xff80}, {0x7fc00000, 0x7fc0}, {0x7f800001, 0x7fc0}, {0xff812345, 0xffc1}, {0x7fffffff, 0x7fff},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ASSERT_MSG(f32_to_bf16(f32_from_bits(cases[i].f)) == cases[i].h, "0x%08x -> 0x%04x, expected 0x%04x",
                   cases[i].f, f32_to_bf16(f32_from_bits(cases[i].f)), cases[i].h);
    // Every pattern widens exactly and narrows back to itself; NaNs stay NaN (made quiet).
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        ASSERT(f32_bits(f) == h << 16);
        ASSERT(isnan(f) ? f32_to_bf16(f) == (h | 0x40) : f32_to_bf16(f) == h);
    }
    // Random fp32 patterns against the reference.
    Rng r = rng_seeded(7, 1);
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)rng_next(&r);
        float x = f32_from_bits(u);
        if (!isfinite(x)) continue;
        uint16_t want =
            ref_round(fabs((double)x), (uint16_t)((u & 0x7fffffff) >> 16), val_bf16) | (uint16_t)((u >> 16) & 0x8000);
        ASSERT_MSG(f32_to_bf16(x) == want, "0x%08x -> 0x%04x, expected 0x%04x", u, f32_to_bf16(x), want);
    }
}

TEST(safetensors_half_f16) {
    // Exhaustive widening against the formula: subnormals m·2^-24, normals (1 + m/1024)·2^(e−15).
    for (uint32_t h = 0; h < 65536; h++) {
        int e = (h >> 10) & 31, m = h & 1023;
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
        if (h & 0x8000) v = -v;
        float f = f16_to_f32((uint16_t)h);
        ASSERT_MSG(isnan(v) ? isnan(f) && ((f32_bits(f) >> 13) & 0x3ff) == (uint32_t)m
                            : (double)f == v && !!signbit(f) == !!(h & 0x8000),
                   "f16 0x%04x -> %g, expected %g", h, f, v);
        ASSERT(isnan(f) ? f32_to_f16(f) == (h | 0x200) : f32_to_f16(f) == h);
    }
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0x1p-24f, 0x0001},        {0x1p-25f, 0x0000},          {0x1.8p-25f, 0x0001}, {0x1.8p-24f, 0x0002},
        {0x1.4p-23f, 0x0002},      {-0x1p-24f, 0x8001},         {0x1p-26f, 0x0000},   {0x1.ffcp-15f, 0x0400},
        {0x1.ff8p-15f, 0x03ff},    {0x1.ff4p-15f, 0x03fe},      {0x1p-14f, 0x0400},   {65504.f, 0x7bff},
        {65519.f, 0x7bff},         {65520.f, 0x7c00},           {1e6f, 0x7c00},       {-INFINITY, 0xfc00},
        {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x1.8p-10f, 0x3c02},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ASSERT_MSG(f32_to_f16(cases[i].f) == cases[i].h, "%a -> 0x%04x, expected 0x%04x", cases[i].f,
                   f32_to_f16(cases[i].f), cases[i].h);
    ASSERT(f32_to_f16(NAN) == 0x7e00 && isnan(f16_to_f32(f32_to_f16(-NAN))) && (f32_to_f16(-NAN) & 0x8000));
    // Random values spread over the half range (and beyond) against the reference.
    Rng r = rng_seeded(7, 2);
    for (int i = 0; i < 1000000; i++) {
        uint64_t z = rng_next(&r);
        float x = (float)ldexp((double)(z >> 40) / (1 << 24), (int)(z % 48) - 30) * ((z >> 8) & 1 ? -1 : 1);
        double ax = fabs((double)x);
        uint16_t lo = 0, hi = 0x7c00; // largest pattern with value <= |x|, by bisection over the ordered patterns
        while (hi - lo > 1) {
            uint16_t mid = (lo + hi) / 2;
            if (val_f16(mid) <= ax) lo = mid;
            else hi = mid;
        }
        uint16_t want = (val_f16(0x7c00) <= ax ? 0x7c00 : ref_round(ax, lo, val_f16)) | (signbit(x) ? 0x8000 : 0);
        ASSERT_MSG(f32_to_f16(x) == want, "%a -> 0x%04x, expected 0x%04x", x, f32_to_f16(x), want);
    }
}

// ---- files written by HF (tests/data/safetensors/make_fixtures.py, run on the device machine) ----
#define FX "tests/data/safetensors/"

static uint64_t fnv64(const void *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ULL;
    return h;
}

static bool same_hash(const void *p, size_t n, const char *hex) {
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)fnv64(p, n));
    return hex && !strcmp(buf, hex);
}

// Re-writing every tensor of an HF file raw, with its metadata, must give HF's file byte for byte.
static void expect_rewrite_identical(const char *path) {
    StFile f;
    st_open_or_die(&f, path);
    StWriter w;
    st_writer_init(&w);
    const char *k;
    json_t *v;
    json_object_foreach(f.metadata, k, v) st_writer_meta(&w, k, json_string_value(v));
    for (int i = 0; i < f.n; i++) st_writer_add_raw(&w, f.t[i].name, f.t[i].dt, f.t[i].nd, f.t[i].shape, f.t[i].data);
    st_writer_write(&w, tpath("rewrite.safetensors"));
    size_t n;
    char *b = file_read_all(tpath("rewrite.safetensors"), &n);
    bool same = n == f.size && !memcmp(b, f.map, n);
    free(b);
    st_writer_free(&w);
    st_close(&f);
    ASSERT_MSG(same, "%s: rewritten file differs", path);
}

TEST(safetensors_hf_fixtures) {
    fresh_dir();
    json_t *man = json_load_or_die(FX "manifest.json");
    StFile f;
    StSet s;
    st_open_or_die(&f, FX "hf_single.safetensors");
    st_set_open_or_die(&s, FX "m");
    ASSERT(!strcmp(st_meta(&f, "format"), "pt") && !strcmp(st_meta(&f, "k"), "v"));
    int nsingle = 0, nm = 0;
    const char *key;
    json_t *e;
    json_object_foreach(man, key, e) {
        const char *name = strchr(key, ':') + 1;
        const StTensor *t;
        if (!strncmp(key, "hf_single.safetensors:", 22)) {
            t = st_find(&f, name), nsingle++;
        } else if (!strncmp(key, "m/", 2)) {
            t = st_set_find(&s, name), nm++;
            size_t fl = t ? strlen(t->file) : 0, sl = (size_t)(name - 1 - (key + 2));
            ASSERT_MSG(t && fl > sl && !strncmp(t->file + fl - sl, key + 2, sl), "%s: in %s", key, t ? t->file : "?");
        } else {
            continue;
        }
        ASSERT_MSG(t, "%s missing", key);
        ASSERT(!strcmp(st_dtype_name(t->dt), json_string_value(json_object_get(e, "dtype"))));
        json_t *shape = json_object_get(e, "shape");
        ASSERT((size_t)t->nd == json_array_size(shape));
        for (int i = 0; i < t->nd; i++) ASSERT(t->shape[i] == json_integer_value(json_array_get(shape, (size_t)i)));
        ASSERT_MSG(same_hash(t->data, t->bytes, json_string_value(json_object_get(e, "raw"))), "%s: raw bytes differ",
                   key);
        if (json_object_get(e, "f32")) {
            float *x = xmalloc((size_t)t->numel * sizeof(float));
            st_read_f32(t, x);
            bool ok = same_hash(x, (size_t)t->numel * sizeof(float), json_string_value(json_object_get(e, "f32")));
            free(x);
            ASSERT_MSG(ok, "%s: fp32 conversion differs from torch's", key);
        }
    }
    ASSERT(nsingle == f.n && nsingle == 18 && nm == s.n && nm > 40 && s.nfiles == 3);
    expect_rewrite_identical(FX "hf_single.safetensors");
    expect_rewrite_identical(FX "rounding.safetensors");
    for (int i = 0; i < s.nfiles; i++) expect_rewrite_identical(s.files[i].path);
    st_set_close(&s);
    st_close(&f);
    json_decref(man);

    // torch's fp32 -> bf16 / fp16 roundings of 8192 patterns (ties, fp16 range edges, subnormals) equal ours.
    st_open_or_die(&f, FX "rounding.safetensors");
    const StTensor *r = st_find(&f, "r"), *rb = st_find(&f, "r_bf16"), *rh = st_find(&f, "r_f16");
    ASSERT(r && rb && rh && r->numel == 8192 && rb->numel == 8192 && rh->numel == 8192);
    for (int64_t i = 0; i < r->numel; i++) {
        float x;
        uint16_t b, h;
        memcpy(&x, (const char *)r->data + 4 * i, 4);
        memcpy(&b, (const char *)rb->data + 2 * i, 2);
        memcpy(&h, (const char *)rh->data + 2 * i, 2);
        ASSERT_MSG(f32_to_bf16(x) == b && f32_to_f16(x) == h,
                   "0x%08x: bf16 0x%04x (torch 0x%04x), f16 0x%04x (torch 0x%04x)", f32_bits(x), f32_to_bf16(x), b,
                   f32_to_f16(x), h);
    }
    st_close(&f);
}

// test_tokenize.c — `pith tokenize` end to end: the .bin bytes against NumPy's .npy rules (checked byte by byte, no
// numpy here), document ends and EOS, .jsonl/.jsonl.zst/.txt inputs, error messages and exit codes, --on-error skip,
// determinism across --workers, resume. Uses DeepSeek-V3's tokenizer (quick to load; prepends BOS) and Qwen3's.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "base/bpe.h"
#include "base/npy.h"
#include "test.h"

#define DSV3 "data/tokenizers/deepseek_v3"
#define QWEN3 "data/tokenizers/qwen3"

static char out[1 << 16];

static void need_tokenizers(void) {
    ASSERT_MSG(path_exists(DSV3 "/tokenizer.json") && path_exists(QWEN3 "/tokenizer.json"),
               "tokenizer files are missing: run scripts/tokenizers.sh (scripts/deps.sh runs it)");
    ASSERT_MSG(path_exists(PITH_BIN), "%s is missing: make build/pith (make test builds it)", PITH_BIN);
}

static Bpe *tok_dsv3(void) {
    static Bpe *t;
    need_tokenizers();
    if (!t) t = bpe_load(DSV3);
    return t;
}

// Checks one .npy record at buf[0..len) byte by byte (NumPy format 1.0: magic, version, uint16 LE header length,
// the dict text numpy writes, space padding, '\n', 64-byte alignment of the data) and returns its element count.
static int64_t check_npy(const uint8_t *buf, size_t len, const char *descr, size_t elem, const uint8_t **data) {
    ASSERT(len >= 10 && !memcmp(buf, "\x93NUMPY\x01\x00", 8));
    size_t hlen = buf[8] | (size_t)buf[9] << 8;
    ASSERT_MSG((10 + hlen) % 64 == 0, "header of %zu bytes is not 64-byte aligned", hlen);
    ASSERT(10 + hlen <= len && buf[10 + hlen - 1] == '\n');
    char hdr[256], want[256];
    ASSERT(hlen < sizeof hdr);
    memcpy(hdr, buf + 10, hlen), hdr[hlen] = 0;
    long long n = -1;
    char *sh = strstr(hdr, "'shape': (");
    ASSERT(sh && sscanf(sh, "'shape': (%lld,)", &n) == 1 && n >= 0);
    int wl = snprintf(want, sizeof want, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr, n);
    ASSERT_MSG(!strncmp(hdr, want, wl), "header '%s', want '%s'", hdr, want);
    for (size_t i = wl; i + 1 < hlen; i++) ASSERT(hdr[i] == ' ');
    ASSERT(10 + hlen + n * elem <= len);
    *data = buf + 10 + hlen;
    return n;
}

typedef struct {
    uint8_t *file;
    size_t len;
    const uint32_t *tok;
    uint64_t *ends; // a copy: the second record is only 4-byte aligned in the file when the token count is odd
    int64_t ntok, ndocs;
} Bin;

// Reads and checks a .bin file: two records, nothing after them, ends increasing and ending at ntok.
static Bin read_bin(const char *path) {
    Bin b = {0};
    b.file = (uint8_t *)file_read_all(path, &b.len);
    ASSERT_MSG(b.file, "%s: missing", path);
    const uint8_t *d1, *d2;
    b.ntok = check_npy(b.file, b.len, "<u4", 4, &d1);
    size_t at = (size_t)(d1 - b.file) + 4 * b.ntok;
    b.ndocs = check_npy(b.file + at, b.len - at, "<u8", 8, &d2);
    ASSERT_MSG((size_t)(d2 - b.file) + 8 * b.ndocs == b.len, "%s: bytes after the second record", path);
    b.tok = (const uint32_t *)d1, b.ends = xmalloc(8 * b.ndocs + 8);
    memcpy(b.ends, d2, 8 * b.ndocs);
    for (int64_t i = 0; i < b.ndocs; i++) ASSERT(b.ends[i] > (i ? b.ends[i - 1] : 0));
    ASSERT(b.ndocs ? b.ends[b.ndocs - 1] == (uint64_t)b.ntok : b.ntok == 0);
    return b;
}

// The ids pith should write for a document: BOS (DeepSeek-V3 asks for it), the text's ids, EOS.
static IdVec expected_doc(const char *text, size_t n, uint32_t eos) {
    Bpe *t = tok_dsv3();
    BpeScratch *s = bpe_scratch_new(t);
    IdVec v = {0};
    bpe_encode(t, s, text, n, true, &v);
    idvec_push(&v, eos);
    bpe_scratch_free(s);
    return v;
}

static void assert_doc_n(const Bin *b, int64_t d, const char *text, size_t n, uint32_t eos) {
    IdVec v = expected_doc(text, n, eos);
    uint64_t start = d ? b->ends[d - 1] : 0;
    ASSERT_MSG(d < b->ndocs && b->ends[d] - start == v.n && !memcmp(b->tok + start, v.p, 4 * v.n),
               "document %lld ('%s') differs", (long long)d, text);
    idvec_free(&v);
}

static void assert_doc(const Bin *b, int64_t d, const char *text, uint32_t eos) {
    assert_doc_n(b, d, text, strlen(text), eos);
}

TEST(tokenize_npy_format) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o[512];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o, sizeof o, "%s/out", dir);
    write_text(in, "a.jsonl",
               "{\"text\": \"Hello world\", \"id\": 1}\n{\"text\": \"\"}\n\n{\"id\": 3, \"text\": \"caf\\u00e9 "
               "<\\uff5cUser\\uff5c>\\n\"}");
    int rc =
        run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/a.jsonl --output %s", PITH_BIN, in, o);
    ASSERT_MSG(rc == 0, "%s", out);
    ASSERT(strstr(out, "1 files written") && strstr(out, "3 documents"));
    char bin[600];
    snprintf(bin, sizeof bin, "%s/a.jsonl.bin", o);
    Bin b = read_bin(bin);
    ASSERT(b.ndocs == 3 && b.tok[0] == 0 && b.tok[b.ntok - 1] == 1); // BOS ... EOS (<｜end▁of▁sentence｜> = 1)
    assert_doc(&b, 0, "Hello world", 1);
    assert_doc(&b, 1, "", 1);
    assert_doc(&b, 2, "caf\xC3\xA9 <\xEF\xBD\x9CUser\xEF\xBD\x9C>\n", 1);
    ASSERT(b.ends[1] - b.ends[0] == 2); // the empty text: BOS EOS
    free(b.file), free(b.ends);
    snprintf(bin, sizeof bin, "%s/a.jsonl.bin.tmp", o);
    ASSERT(!path_exists(bin));
}

TEST(tokenize_txt_zst_and_paths) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o1[512], o2[512], path[700];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o1, sizeof o1, "%s/o1", dir), snprintf(o2, sizeof o2, "%s/o2", dir);
    const char *txt = "First paragraph,\nstill first.\n\n  \t\nSecond one.\n\n\n\nThird\xff\n";
    write_text(in, "sub/deeper/doc.txt", txt);
    const char *jsonl = "{\"text\": \"one\"}\n{\"text\": \"two three\"}\n";
    write_text(in, "x/plain.jsonl", jsonl);
    char z[256];
    size_t zn = ZSTD_compress(z, sizeof z, jsonl, strlen(jsonl), 3);
    ASSERT(!ZSTD_isError(zn));
    write_bytes(in, "x/packed.jsonl.zst", z, zn);
    write_text(in, ".hidden/skip.jsonl", "not json");
    write_text(in, "notes.md", "ignored");
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s --output %s --eos '<|EOT|>'",
                     PITH_BIN, in, o1);
    ASSERT_MSG(rc == 0 && strstr(out, "3 files written"), "%s", out);
    uint32_t eot = (uint32_t)bpe_token_to_id(tok_dsv3(), "<|EOT|>");
    snprintf(path, sizeof path, "%s/sub/deeper/doc.txt.bin", o1);
    Bin b = read_bin(path);
    ASSERT(b.ndocs == 1);
    assert_doc(&b, 0, txt, eot);
    free(b.file), free(b.ends);
    snprintf(path, sizeof path, "%s/x/plain.jsonl.bin", o1);
    Bin p = read_bin(path);
    snprintf(path, sizeof path, "%s/x/packed.jsonl.zst.bin", o1);
    Bin q = read_bin(path);
    ASSERT(p.len == q.len && !memcmp(p.file, q.file, p.len) && p.ndocs == 2);
    assert_doc(&p, 1, "two three", eot);
    free(p.file), free(p.ends), free(q.file), free(q.ends);
    // paragraphs, an id for --eos, and a single file as input
    rc = run_cmd(out, sizeof out,
                 "%s tokenize --tokenizer " DSV3
                 "/tokenizer.json --input %s/sub/deeper/doc.txt --output %s --txt-split paragraph --eos 7",
                 PITH_BIN, in, o2);
    ASSERT_MSG(rc == 0 && strstr(out, "invalid UTF-8 replaced in 1 documents"), "%s", out);
    snprintf(path, sizeof path, "%s/doc.txt.bin", o2);
    b = read_bin(path);
    ASSERT(b.ndocs == 3);
    assert_doc(&b, 0, "First paragraph,\nstill first.", 7);
    assert_doc(&b, 1, "Second one.", 7);
    assert_doc(&b, 2, "Third\xEF\xBF\xBD", 7);
    free(b.file), free(b.ends);
}

// Each error: one line naming the file (and line), exit status 1, and no output under a final (or temporary) name.
TEST(tokenize_errors) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o[512];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o, sizeof o, "%s/out", dir);
    write_text(in, "bad_json.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"broken\n{\"text\": \"ok\"}\n");
    write_text(in, "no_field.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n");
    write_text(in, "not_string.jsonl", "{\"text\": 5}\n");
    write_text(in, "bad.csv", "a,b\n");
    const char *jsonl = "{\"text\": \"one\"}\n{\"text\": \"two\"}\n";
    char z[256];
    size_t zn = ZSTD_compress(z, sizeof z, jsonl, strlen(jsonl), 3);
    ASSERT(!ZSTD_isError(zn));
    write_bytes(in, "cut.jsonl.zst", z, zn - 5);
    static const struct {
        const char *file, *extra, *msg;
    } cases[] = {
        {"bad_json.jsonl", "", "bad_json.jsonl:2: malformed JSON"},
        {"no_field.jsonl", "", "no_field.jsonl:2: no field \"text\""},
        {"no_field.jsonl", "--field body", "no_field.jsonl:1: no field \"body\""},
        {"not_string.jsonl", "", "not_string.jsonl:1: field \"text\" is not a string"},
        {"cut.jsonl.zst", "", "cut.jsonl.zst: truncated zstd data"},
        {"bad.csv", "", "bad.csv: unsupported input"},
        {"missing.jsonl", "", "missing.jsonl: no such file"},
        {"no_field.jsonl", "--eos '<nope>'", "--eos '<nope>' is not a token"},
        {"no_field.jsonl", "--on-error maybe", "--on-error must be fail or skip"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/%s --output %s %s", PITH_BIN, in,
                         cases[i].file, o, cases[i].extra);
        ASSERT_MSG(rc == 1 && strstr(out, cases[i].msg), "case %zu: exit %d, output: %s", i, rc, out);
        ASSERT_MSG(strchr(out, '\n') == out + strlen(out) - 1, "case %zu: more than one line: %s", i, out);
        char bin[700];
        snprintf(bin, sizeof bin, "%s/%s.bin", o, cases[i].file);
        ASSERT(!path_exists(bin));
        snprintf(bin, sizeof bin, "%s/%s.bin.tmp", o, cases[i].file);
        ASSERT(!path_exists(bin));
    }
    // a tokenizer without tokenizer_config.json has no EOS unless --eos gives one; a non-BPE model is refused
    write_text(dir, "tok/tokenizer.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer %s/tok --input %s/no_field.jsonl --output %s", PITH_BIN,
                     dir, in, o);
    ASSERT_MSG(rc == 1 && strstr(out, "tok/tokenizer.json") && strstr(out, "WordPiece"), "%s", out);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp " DSV3 "/tokenizer.json %s/tok/tokenizer.json", dir); // (no <|endoftext|> in it)
    ASSERT(system(cmd) == 0);
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer %s/tok --input %s/no_field.jsonl --output %s", PITH_BIN, dir,
                 in, o);
    ASSERT_MSG(rc == 1 && strstr(out, "no eos_token"), "%s", out);
}

TEST(tokenize_on_error_skip) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o[512], path[700];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o, sizeof o, "%s/out", dir);
    write_text(in, "a.jsonl", "{\"text\": \"one\"}\n{\"text\": \"broken\n{\"body\": 1}\n{\"text\": \"x\xFF\xFEy\"}\n");
    const char *jsonl = "{\"text\": \"one\"}\n";
    char z[256];
    size_t zn = ZSTD_compress(z, sizeof z, jsonl, strlen(jsonl), 3);
    write_bytes(in, "b.jsonl.zst", z, zn - 3);
    int rc =
        run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s --output %s --on-error skip --workers 2",
                PITH_BIN, in, o);
    ASSERT_MSG(rc == 0, "%s", out);
    ASSERT_MSG(strstr(out, "a.jsonl:2: malformed JSON") && strstr(out, "a.jsonl:3: no field") &&
                   strstr(out, "b.jsonl.zst: truncated"),
               "%s", out);
    ASSERT_MSG(strstr(out, "1 files written") && strstr(out, "1 failed") && strstr(out, "2 documents") &&
                   strstr(out, "2 bad lines skipped") && strstr(out, "invalid UTF-8 replaced in 1 documents"),
               "%s", out);
    snprintf(path, sizeof path, "%s/a.jsonl.bin", o);
    Bin b = read_bin(path);
    ASSERT(b.ndocs == 2);
    assert_doc(&b, 0, "one", 1);
    assert_doc(&b, 1, "x\xEF\xBF\xBD\xEF\xBF\xBDy", 1); // each invalid byte is its own maximal subpart
    free(b.file), free(b.ends);
    snprintf(path, sizeof path, "%s/b.jsonl.zst.bin", o);
    ASSERT(!path_exists(path));
    snprintf(path, sizeof path, "%s/b.jsonl.zst.bin.tmp", o);
    ASSERT(!path_exists(path));
}

// n bytes as one gzip member (zlib's deflate with gzip framing); *len gets its size. Caller frees.
static char *gzip_bytes(const char *data, size_t n, size_t *len) {
    z_stream z = {0};
    CHECK(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t cap = deflateBound(&z, n) + 64;
    char *out = xmalloc(cap);
    z.next_in = (Bytef *)data, z.avail_in = (uInt)n, z.next_out = (Bytef *)out, z.avail_out = (uInt)cap;
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    *len = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

// .jsonl.gz inputs (one member or several, across chunk boundaries) give the bytes of the plain .jsonl; a truncated
// or corrupt one names the file; --format reads files whatever their names; progress to a pipe is plain lines.
TEST(tokenize_gzip_format_and_plain_progress) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o[512], path[700];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o, sizeof o, "%s/out", dir);
    size_t cap = 3 << 20, n = 0; // ~2.5 MB of text: three 1 MB chunks
    char *text = xmalloc(cap);
    for (int i = 0; n + 200 < cap - (512 << 10); i++)
        n += snprintf(text + n, cap - n, "{\"text\": \"document %d: %s\"}\n", i, i % 3 ? "a b c" : "ünïcödé ...");
    write_bytes(in, "plain/a.jsonl", text, n);
    size_t h = n / 2;
    while (text[h - 1] != '\n') h++;
    size_t z1, z2;
    char *g1 = gzip_bytes(text, h, &z1), *g2 = gzip_bytes(text + h, n - h, &z2);
    char *both = xmalloc(z1 + z2);
    memcpy(both, g1, z1), memcpy(both + z1, g2, z2); // two members, as `cat x.gz y.gz` makes
    write_bytes(in, "gz/a.jsonl.gz", both, z1 + z2);
    write_bytes(in, "named/a.data", both, z1 + z2);
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/plain %s/gz --output %s --workers 2",
                     PITH_BIN, in, in, o);
    ASSERT_MSG(rc == 0 && strstr(out, "2 files written"), "%s", out);
    ASSERT_MSG(!strchr(out, '\r') && strstr(out, "tokenize: ") && strstr(out, "100%, ETA 0:00\n"),
               "progress to a pipe is not plain lines: %s", out);
    ASSERT(run_cmd(out, sizeof out, "cmp %s/a.jsonl.bin %s/a.jsonl.gz.bin", o, o) == 0);
    // --format: a name that says nothing is read as what --format says
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/named/a.data --output %s", PITH_BIN, in,
                 o);
    ASSERT_MSG(rc == 1 && strstr(out, "a.data: unsupported input") && strstr(out, "--format says which"), "%s", out);
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/named --output %s --format jsonl.gz",
                 PITH_BIN, in, o);
    ASSERT_MSG(rc == 0, "%s", out);
    ASSERT(run_cmd(out, sizeof out, "cmp %s/a.jsonl.bin %s/a.data.bin", o, o) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/named --output %s --format gz",
                   PITH_BIN, in, o) == 1 &&
           strstr(out, "--format must be jsonl, jsonl.zst, jsonl.gz or txt (got 'gz')"));
    // a device or FIFO is refused at once, also when --format says how to read it (it would block or never end)
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input /dev/zero --output %s --format txt",
                 PITH_BIN, o);
    ASSERT_MSG(rc == 1 && strstr(out, "/dev/zero: not a regular file"), "%s", out);
    snprintf(path, sizeof path, "%s/fifo/a.jsonl", in);
    ASSERT(run_cmd(out, sizeof out, "mkdir -p %s/fifo && mkfifo %s", in, path) == 0);
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/fifo --output %s", PITH_BIN, in, o);
    ASSERT_MSG(rc == 1 && strstr(out, "a.jsonl: not a regular file"), "%s", out);
    // truncated (inside the second member) and corrupt files name the file; nothing is left behind
    write_bytes(in, "bad/t.jsonl.gz", both, z1 + z2 - 9);
    both[z1 + 40] ^= 0x55;
    write_bytes(in, "bad2/c.jsonl.gz", both, z1 + z2);
    static const char *want[] = {"t.jsonl.gz: truncated gzip data", "c.jsonl.gz: invalid"};
    for (int i = 0; i < 2; i++) {
        rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/bad%s --output %s/o%d", PITH_BIN, in,
                     i ? "2" : "", dir, i);
        ASSERT_MSG(rc == 1 && strstr(out, want[i]), "%s", out);
        snprintf(path, sizeof path, "%s/o%d", dir, i);
        ASSERT(run_cmd(out, sizeof out, "find %s -type f | wc -l", path) == 0 && atoi(out) == 0);
    }
    free(text), free(g1), free(g2), free(both);
}

// --on-error skip: the first 20 bad lines are named, the rest counted; a file with not one good line gets no output
// and makes the exit status 1 (the other files are still written).
TEST(tokenize_skip_warning_cap_and_all_bad_file) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o[512], path[700], text[4096];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o, sizeof o, "%s/out", dir);
    size_t n = snprintf(text, sizeof text, "{\"text\": \"good\"}\n");
    for (int i = 0; i < 30; i++) n += snprintf(text + n, sizeof text - n, "{\"body\": %d}\n", i);
    write_text(in, "a.jsonl", text);
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/a.jsonl --output %s --on-error skip",
                     PITH_BIN, in, o);
    ASSERT_MSG(rc == 0, "%s", out);
    int shown = 0;
    for (const char *p = out; (p = strstr(p, "(skipped)")); p++) shown++;
    ASSERT_MSG(shown == 20 && strstr(out, "a.jsonl:21: no field") && !strstr(out, "a.jsonl:22: no field") &&
                   strstr(out, "... and 10 more bad lines (the first 20 are shown above; 30 in all)"),
               "%d shown: %s", shown, out);
    write_text(in, "all/bad.jsonl", "{\"body\": 1}\nnot json\n");
    write_text(in, "all/good.jsonl", "{\"text\": \"fine\"}\n");
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/all --output %s/o2 --on-error skip",
                 PITH_BIN, in, dir);
    ASSERT_MSG(rc == 1 && strstr(out, "bad.jsonl: every line (2) was bad: no output") &&
                   strstr(out, "1 files written") && strstr(out, "1 failed") &&
                   strstr(out, "pith: error: tokenize: every line of 1 input file was bad"),
               "%s", out);
    snprintf(path, sizeof path, "%s/o2/good.jsonl.bin", dir);
    ASSERT(path_exists(path));
    snprintf(path, sizeof path, "%s/o2/bad.jsonl.bin", dir);
    ASSERT(!path_exists(path));
}

// Several files of several chunks each: the same bytes with 1 and 4 workers; a re-run skips complete outputs.
TEST(tokenize_workers_deterministic_and_resume) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o1[512], o4[512], path[700];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o1, sizeof o1, "%s/o1", dir), snprintf(o4, sizeof o4, "%s/o4", dir);
    static const char *words[] = {"the", "quick", "brown", "fox", "jumps", "über",    "日本語",
                                  "😀",   "  ",    "\\n",   "123", "don't", "<|EOT|>", "x"};
    Rng r = rng_seeded(7, 0);
    size_t cap = 3 << 20;
    char *buf = xmalloc(cap + 4096);
    for (int f = 0; f < 3; f++) {
        size_t n = 0, target = f == 0 ? (size_t)(2.5 * (1 << 20)) : 200000;
        while (n < target) {
            n += sprintf(buf + n, "{\"text\": \"");
            for (int w = 0, nw = 1 + (int)rng_below(&r, 300); w < nw; w++)
                n += sprintf(buf + n, "%s ", words[rng_below(&r, 14)]);
            n += sprintf(buf + n, "\"}\n");
        }
        char name[64];
        snprintf(name, sizeof name, "part%d/data.jsonl", f);
        write_bytes(in, name, buf, n);
    }
    free(buf);
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s --output %s --workers 1", PITH_BIN,
                     in, o1);
    ASSERT_MSG(rc == 0 && strstr(out, "3 files written"), "%s", out);
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s --output %s --workers 4", PITH_BIN, in,
                 o4);
    ASSERT_MSG(rc == 0 && strstr(out, "3 files written"), "%s", out);
    for (int f = 0; f < 3; f++) {
        char p1[700], p4[700];
        snprintf(p1, sizeof p1, "%s/part%d/data.jsonl.bin", o1, f),
            snprintf(p4, sizeof p4, "%s/part%d/data.jsonl.bin", o4, f);
        Bin a = read_bin(p1), b = read_bin(p4);
        ASSERT_MSG(a.len == b.len && !memcmp(a.file, b.file, a.len), "part%d differs between 1 and 4 workers", f);
        ASSERT(a.ndocs > 100);
        free(a.file), free(a.ends), free(b.file), free(b.ends);
    }
    // resume: everything exists → nothing is rewritten; remove one output → only that one is written again
    struct stat st0, st1;
    snprintf(path, sizeof path, "%s/part0/data.jsonl.bin", o1);
    ASSERT(stat(path, &st0) == 0);
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s --output %s --workers 2", PITH_BIN, in,
                 o1);
    ASSERT_MSG(rc == 0 && strstr(out, "tokenize: all 3 outputs already exist under ") &&
                   strstr(out, ": nothing to do (delete them to redo)\n") && !strstr(out, "0 documents"),
               "%s", out);
    ASSERT(stat(path, &st1) == 0 && st1.st_mtim.tv_sec == st0.st_mtim.tv_sec &&
           st1.st_mtim.tv_nsec == st0.st_mtim.tv_nsec);
    snprintf(path, sizeof path, "%s/part2/data.jsonl.bin", o1);
    ASSERT(unlink(path) == 0);
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s --output %s --workers 2", PITH_BIN, in,
                 o1);
    ASSERT_MSG(rc == 0 && strstr(out, "2 of 3 outputs already exist") && strstr(out, "1 files written"), "%s", out);
    char p4[700];
    snprintf(p4, sizeof p4, "%s/part2/data.jsonl.bin", o4);
    Bin a = read_bin(path), b = read_bin(p4);
    ASSERT(a.len == b.len && !memcmp(a.file, b.file, a.len));
    free(a.file), free(a.ends), free(b.file), free(b.ends);
}

TEST(tokenize_help) {
    ASSERT_MSG(path_exists(PITH_BIN), "%s is missing: make build/pith (make test builds it)", PITH_BIN);
    int rc = run_cmd(out, sizeof out, "%s tokenize --help", PITH_BIN);
    ASSERT(rc == 0);
    static const char *opts[] = {"--tokenizer", "--input",    "--output", "--workers",  "--eos",    "--field",
                                 "--txt-split", "--on-error", "U+FFFD",   ".jsonl.zst", "--format", ".jsonl.gz"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) ASSERT_MSG(strstr(out, opts[i]), "help lacks %s", opts[i]);
    rc = run_cmd(out, sizeof out, "%s tokenize --input x", PITH_BIN);
    ASSERT(rc == 1 && strstr(out, "--tokenizer is required"));
}

// pith reads JSON lines with its own strict scanner: valid lines decode exactly, each kind of malformed line is
// reported by line number.
TEST(tokenize_json_lines) {
    need_tokenizers();
    const char *dir = test_tmpdir();
    char in[512], o[512], path[700];
    snprintf(in, sizeof in, "%s/in", dir), snprintf(o, sizeof o, "%s/out", dir);
    static const char *lines[] = {
        "{\"text\": \"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\\u0000x\"}",          // 1 every escape
        "{\"a\": [1, -2.5e+3, 0, 1E-2, true, false, null, {\"b\": {}}, []], \"text\": \"ok\"}", // 2 other values
        "{\"text\": \"first\", \"text\": \"second\"}",                                          // 3 the last one counts
        "{\"text\": \"lone \\ud800 surrogate\"}",                                               // 4 → U+FFFD
        "  {\"te\\u0078t\":\"ws\"}  \r",                                                        // 5 escaped key, blanks
        "{\"text\": \"x\",}",
        "{\"text\": 01}",
        "{\"text\": \"tab\traw\"}",
        "{\"text\": \"x\"} extra",
        "[\"text\"]",
        "{\"text\": \"\\x\"}",
        "{\"text\": nul}",
        "{\"text\": 1.}",
        "{\"other\": \"x\"}",
        "{\"text\": {\"text\": \"nested\"}}",
        "{\"text\": \"unterminated}",
        "{\"text\": \"x\"",
        "{\"a\": [1 2], \"text\": \"x\"}",
    };
    static const char *errs[] = {"malformed JSON",
                                 "malformed JSON",
                                 "malformed JSON: control character",
                                 "malformed JSON: text after",
                                 "not a JSON object",
                                 "malformed JSON: invalid escape",
                                 "malformed JSON: unexpected character",
                                 "malformed JSON: malformed number",
                                 "no field \"text\"",
                                 "field \"text\" is not a string",
                                 "malformed JSON: unterminated",
                                 "malformed JSON: expected ',' or '}'",
                                 "malformed JSON: expected ',' or ']'"};
    char buf[4096];
    size_t n = 0;
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) n += sprintf(buf + n, "%s\n", lines[i]);
    write_bytes(in, "j.jsonl", buf, n);
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " DSV3 " --input %s/j.jsonl --output %s --on-error skip",
                     PITH_BIN, in, o);
    ASSERT_MSG(rc == 0 && strstr(out, "5 documents") && strstr(out, "13 bad lines skipped"), "%s", out);
    for (int i = 0; i < 13; i++) {
        char want[256];
        snprintf(want, sizeof want, "j.jsonl:%d: %s", 6 + i, errs[i]);
        ASSERT_MSG(strstr(out, want), "no '%s' in: %s", want, out);
    }
    snprintf(path, sizeof path, "%s/j.jsonl.bin", o);
    Bin b = read_bin(path);
    const char first[] = "a\"b\\c/d\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80\0x";
    assert_doc_n(&b, 0, first, sizeof first - 1, 1);
    assert_doc(&b, 1, "ok", 1);
    assert_doc(&b, 2, "second", 1);
    assert_doc(&b, 3, "lone \xEF\xBF\xBD surrogate", 1);
    assert_doc(&b, 4, "ws", 1);
    free(b.file), free(b.ends);
}

// A full disk (here a file-size limit: writes past it fail with EFBIG) stops tokenize with the file named,
// exit status 1, no crash and no .bin.tmp left behind.
TEST(tokenize_write_failure) {
    need_tokenizers();
    const char *in = test_tmpdir(), *o = test_tmpdir();
    char text[1 << 15];
    size_t n = 0;
    for (int i = 0; i < 400; i++)
        n += snprintf(text + n, sizeof text - n, "{\"text\": \"document %d of a corpus\"}\n", i);
    write_text(in, "a.jsonl", text);
    int rc = run_cmd(out, sizeof out, "ulimit -f 4; %s tokenize --tokenizer " DSV3 " --input %s/a.jsonl --output %s",
                     PITH_BIN, in, o);
    ASSERT_MSG(rc == 1 && strstr(out, "a.jsonl.bin.tmp: write failed: File too large") && !strstr(out, "free()") &&
                   !strstr(out, "Aborted"),
               "exit %d: %s", rc, out);
    ASSERT(run_cmd(out, sizeof out, "ls -A %s", o) == 0 && !strcmp(out, ""));
}

// The default EOS: <|endoftext|> where the vocabulary has one (Qwen3's tokenizer_config.json says <|im_end|>, a
// chat-turn end), else tokenizer_config.json's eos_token (DeepSeek-V3); --eos naming an ordinary token warns.
TEST(tokenize_default_eos_per_tokenizer) {
    need_tokenizers();
    const char *in = test_tmpdir(), *o = test_tmpdir();
    write_text(in, "a.jsonl", "{\"text\": \"hello\"}\n");
    static const struct {
        const char *tok, *eos;
    } cases[] = {{QWEN3, "<|endoftext|>"}, {DSV3, "<｜end▁of▁sentence｜>"}};
    for (int i = 0; i < 2; i++) {
        char od[600];
        snprintf(od, sizeof od, "%s/%d", o, i);
        int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer %s --input %s/a.jsonl --output %s", PITH_BIN,
                         cases[i].tok, in, od);
        ASSERT_MSG(rc == 0, "%s: %s", cases[i].tok, out);
        Bpe *t = bpe_load(cases[i].tok);
        int64_t want = bpe_token_to_id(t, cases[i].eos);
        bpe_free(t);
        char bin[700];
        snprintf(bin, sizeof bin, "%s/a.jsonl.bin", od);
        size_t n;
        uint8_t *b = (uint8_t *)file_read_all(bin, &n);
        NpyRecord tr, er;
        char err[300];
        ASSERT(b && npy_token_file_parse(b, n, &tr, &er, &(NpyRecord){0}, err, sizeof err) && tr.dt == DT_U32 &&
               tr.n > 0);
        uint32_t last = ((const uint32_t *)tr.data)[tr.n - 1];
        ASSERT_MSG(want >= 0 && last == (uint32_t)want, "%s: last token %u, expected %s = %lld", cases[i].tok, last,
                   cases[i].eos, (long long)want);
        free(b);
    }
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer " QWEN3 " --input %s/a.jsonl --output %s/x --eos hello",
                     PITH_BIN, in, o);
    ASSERT_MSG(rc == 0 && strstr(out, "pith: warning: tokenize: --eos 'hello'") && strstr(out, "is an ordinary token"),
               "%s", out);
}

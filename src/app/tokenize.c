// tokenize.c — `pith tokenize`: turns text corpora into PithTrain token files (docs/reference.md §18).
// Each input file (.jsonl, .jsonl.zst/.jsonl.zstd, .jsonl.gz, .txt) becomes <output>/<relative path>.bin: a uint32
// .npy record of all documents' ids, each document followed by EOS, then a uint64 .npy record of cumulative document
// ends; with --format prompt-completion a third, the uint8 loss mask (0 on prompt tokens). Threads: the main thread reads files (zstd or zlib streaming) and cuts them into chunks of whole lines (or
// paragraphs) of about 1 MB; worker threads parse and tokenize chunks; the main thread writes chunk results in
// file order, so the output does not depend on the number of workers. A file is written under <name>.tmp and
// renamed when complete; a re-run skips outputs that exist.
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>
#include <zlib.h>
#include <zstd.h>

#include "app/app.h"
#include "base/bpe.h"
#include "base/npy.h"

#define CHUNK_BYTES (1u << 20)
enum { IN_JSONL, IN_JSONL_ZST, IN_JSONL_GZ, IN_TXT };
#define WARN_CAP 20 // bad-line warnings shown; the rest are counted

// The formats by name (--format) and by file extension.
static const struct {
    const char *ext;
    int kind;
} formats[] = {{".jsonl", IN_JSONL},
               {".jsonl.zst", IN_JSONL_ZST},
               {".jsonl.zstd", IN_JSONL_ZST},
               {".jsonl.gz", IN_JSONL_GZ},
               {".txt", IN_TXT}};
static int forced_kind = -1;   // --format: every input is read as this kind, whatever its name
static bool prompt_completion; // --format prompt-completion: JSONL of prompt/completion pairs, masked prompts

typedef struct {
    char *path, *rel, *out, *tmp;
    int kind;
    uint64_t size;
    // writer state
    FILE *f;
    bool skip, failed, read_done;
    uint64_t bad;             // lines left out (--on-error skip)
    char *error;              // why reading failed (reported by the writer, in file order)
    int64_t nchunks, written; // chunks made by the reader (final once read_done) and written so far
    uint64_t ntok, *ends;
    size_t nends, ends_cap;
    uint8_t *mask; // (ntok) prompt-completion: 1 a loss target, 0 a prompt token
} InFile;

typedef struct Chunk {
    int file;
    int64_t seq, line0; // chunk number within its file; line number of its first line (1-based)
    char *data;
    size_t len, cap, in_bytes; // bytes of data; input bytes (compressed for .zst) it came from, for progress
    IdVec ids;
    uint64_t *ends; // cumulative document ends within the chunk
    uint8_t *mask;  // (ids.n) prompt-completion: 1 a loss target, 0 a prompt token
    size_t mask_cap;
    size_t ndocs, ends_cap, repaired, bad, text_bytes; // repaired: documents with invalid UTF-8; bad: lines skipped
    Str errors; // one message per line; in fail mode the first error stops the chunk
    struct Chunk *next;
} Chunk;

typedef struct {
    const Bpe *tok;
    const char *field;
    bool paragraphs, fail_fast;
    uint32_t eos;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    Chunk *work_head, *work_tail, *done;
    bool stop;
} Shared;

// ---- inputs -------------------------------------------------------------------------------------------------------

// The kind of an input file: --format's, else by its extension; -1 for neither.
static int input_kind(const char *name) {
    if (forced_kind >= 0) return forced_kind;
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        size_t e = strlen(formats[i].ext);
        if (n > e && !strcmp(name + n - e, formats[i].ext)) return formats[i].kind;
    }
    return -1;
}

static InFile *files;
static int nfiles, files_cap;

static void add_file(const char *path, const char *rel, const char *outdir) {
    struct stat st;
    if (stat(path, &st)) die("%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) // a FIFO or device would block or read forever, also under --format
        die("%s: not a regular file (tokenize reads files and folders of them)", path);
    if (nfiles == files_cap)
        files_cap = files_cap ? 2 * files_cap : 64, files = xrealloc(files, files_cap * sizeof *files);
    InFile *f = &files[nfiles++];
    *f = (InFile){.path = xstrdup(path), .rel = xstrdup(rel), .kind = input_kind(path), .size = (uint64_t)st.st_size};
    size_t n = strlen(outdir) + strlen(rel) + 16;
    f->out = xmalloc(n), f->tmp = xmalloc(n);
    snprintf(f->out, n, "%s/%s.bin", outdir, rel);
    snprintf(f->tmp, n, "%s/%s.bin.tmp", outdir, rel);
}

static void walk_dir(const char *dir, const char *rel, const char *outdir) {
    DIR *d = opendir(dir);
    if (!d) die("%s: cannot read directory: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; // hidden files and folders, "." and ".."
        char path[4096], r[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        if (path_is_dir(path)) walk_dir(path, r, outdir);
        else if (input_kind(e->d_name) >= 0) add_file(path, r, outdir);
    }
    closedir(d);
}

static int cmp_rel(const void *a, const void *b) { return strcmp(((const InFile *)a)->rel, ((const InFile *)b)->rel); }

// Removes the temporary outputs of files still being written (at exit after an error).
static void remove_partial_outputs(void) {
    for (int i = 0; i < nfiles; i++)
        if (files[i].f) fclose(files[i].f), files[i].f = NULL, unlink(files[i].tmp);
}

// ---- one JSON line -----------------------------------------------------------------------------------------------
// A strict JSON reader for one line (RFC 8259): it checks the whole value and decodes the string of one top-level
// field (the last one if repeated). jansson would build a tree of every line at about 90 MB/s, slower than the
// tokenizer; this runs at memory speed. A lone surrogate escape (\ud800) decodes to U+FFFD.

typedef struct {
    const char *p, *end;
    const char *err;
    int depth;
} JScan;

static bool js_fail(JScan *s, const char *why) {
    if (!s->err) s->err = why;
    return false;
}

static void js_ws(JScan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int js_hex4(const char *q) { // four hex digits, or -1
    int v = 0;
    for (int i = 0; i < 4; i++) {
        if (!isxdigit((unsigned char)q[i])) return -1;
        v = v * 16 + (q[i] <= '9' ? q[i] - '0' : (q[i] | 0x20) - 'a' + 10);
    }
    return v;
}

// A string at s->p (a '"'); its decoded UTF-8 goes to out unless out is NULL.
static bool js_string(JScan *s, Str *out) {
    if (s->p >= s->end || *s->p != '"') return js_fail(s, "expected a string");
    s->p++;
    for (;;) {
        const char *q = s->p;
        while (q < s->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
        if (out) str_put(out, s->p, q - s->p);
        s->p = q;
        if (q >= s->end) return js_fail(s, "unterminated string");
        if (*q == '"') return s->p++, true;
        if ((unsigned char)*q < 0x20) return js_fail(s, "control character in a string");
        if (q + 1 >= s->end) return js_fail(s, "unterminated string");
        char c = q[1], u[4];
        s->p = q + 2;
        const char *esc = strchr("\"\\/bfnrt", c);
        if (c && esc) {
            if (out) str_put(out, &"\"\\/\b\f\n\r\t"[esc - "\"\\/bfnrt"], 1);
            continue;
        }
        if (c != 'u') return js_fail(s, "invalid escape in a string");
        int cp = s->end - s->p >= 4 ? js_hex4(s->p) : -1;
        if (cp < 0) return js_fail(s, "invalid \\u escape");
        s->p += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u') {
            int lo = js_hex4(s->p + 2);
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00), s->p += 6;
        }
        if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
        if (out) str_put(out, u, (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)u));
    }
}

// Any value at s->p. With field != NULL (the top-level object), the string value of that key goes to out and *state
// says what the key held: 0 absent, 1 a string, 2 something else.
static bool js_value(JScan *s, const char *field, Str *out, Str *key, int *state) {
    js_ws(s);
    if (s->p >= s->end) return js_fail(s, "unexpected end of line");
    char c = *s->p;
    if (c == '"') return js_string(s, NULL);
    if (c == '{' || c == '[') {
        if (++s->depth > 512) return js_fail(s, "nested too deeply");
        char close = c == '{' ? '}' : ']';
        s->p++, js_ws(s);
        if (s->p < s->end && *s->p == close) return s->p++, s->depth--, true;
        for (;;) {
            bool want = false;
            if (c == '{') {
                js_ws(s);
                if (key) key->n = 0;
                if (!js_string(s, field ? key : NULL)) return false;
                want = field && key->n == strlen(field) && !memcmp(key->p, field, key->n);
                js_ws(s);
                if (s->p >= s->end || *s->p != ':') return js_fail(s, "expected ':'");
                s->p++, js_ws(s);
            }
            if (want) *state = s->p < s->end && *s->p == '"' ? 1 : 2, out->n = 0;
            if (!(want && *state == 1 ? js_string(s, out) : js_value(s, NULL, NULL, NULL, NULL))) return false;
            js_ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            if (s->p < s->end && *s->p == close) return s->p++, s->depth--, true;
            return js_fail(s, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    static const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(lits[i]);
        if ((size_t)(s->end - s->p) >= k && !memcmp(s->p, lits[i], k)) return s->p += k, true;
    }
    const char *q = s->p, *e = s->end; // a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
#define DIGIT(q) ((q) < e && *(q) >= '0' && *(q) <= '9')
    if (q < e && *q == '-') q++;
    if (!DIGIT(q)) return js_fail(s, "unexpected character");
    if (*q++ != '0')
        while (DIGIT(q)) q++;
    if (q < e && *q == '.') {
        q++;
        if (!DIGIT(q)) return js_fail(s, "malformed number");
        while (DIGIT(q)) q++;
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        if (++q < e && (*q == '+' || *q == '-')) q++;
        if (!DIGIT(q)) return js_fail(s, "malformed number");
        while (DIGIT(q)) q++;
    }
#undef DIGIT
    s->p = q;
    return true;
}

// The string value of top-level `field` of the JSON object line[0..n) into out; else an error message (with *col).
static const char *json_line_field(const char *line, size_t n, const char *field, Str *out, Str *key, size_t *col) {
    JScan s = {line, line + n, NULL, 0};
    int state = 0;
    js_ws(&s);
    if (s.p < s.end && *s.p != '{') return *col = 1, "not a JSON object";
    if (js_value(&s, field, out, key, &state)) {
        js_ws(&s);
        if (s.p < s.end) js_fail(&s, "text after the object");
    }
    *col = (size_t)(s.p - line) + 1;
    return s.err ? s.err : state == 0 ? "no field" : state == 2 ? "not a string" : NULL;
}

// One document: text's ids (under prompt-completion the prompt's: not targets), completion's if any, EOS; its end.
static void chunk_document(Shared *sh, BpeScratch *s, Chunk *c, const char *text, size_t len, const Str *completion) {
    size_t n0 = c->ids.n;
    bpe_encode(sh->tok, s, text, len, true, &c->ids);
    size_t n1 = c->ids.n;
    if (completion) bpe_encode(sh->tok, s, completion->p, completion->n, false, &c->ids);
    idvec_push(&c->ids, sh->eos);
    if (c->ndocs == c->ends_cap)
        c->ends_cap = c->ends_cap ? 2 * c->ends_cap : 1024, c->ends = xrealloc(c->ends, c->ends_cap * 8);
    c->ends[c->ndocs++] = c->ids.n;
    c->text_bytes += len + (completion ? completion->n : 0);
    if (!prompt_completion) return;
    if (c->ids.n > c->mask_cap) c->mask_cap = 2 * c->ids.n, c->mask = xrealloc(c->mask, c->mask_cap);
    memset(c->mask + n0, 0, n1 - n0), memset(c->mask + n1, 1, c->ids.n - n1);
}

// A .txt document: its invalid UTF-8 is counted here (bpe_encode would replace it anyway).
static void txt_document(Shared *sh, BpeScratch *s, Chunk *c, const char *text, size_t len) {
    size_t n;
    char *fixed = bpe_utf8_repair(text, len, &n);
    chunk_document(sh, s, c, fixed ? fixed : text, fixed ? n : len, NULL);
    c->repaired += fixed != NULL;
    free(fixed);
}

static bool blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return false;
    return true;
}

typedef struct {
    BpeScratch *s;
    Str text, key, completion;
} Worker;

// Names line `line`'s error err of field `field` in the chunk's errors (json_line_field's messages).
static void line_error(Chunk *c, const char *name, int64_t line, const char *field, const char *err, size_t col) {
    Str *e = &c->errors;
    if (!strcmp(err, "no field")) str_printf(e, "%s:%lld: no field \"%s\"\n", name, (long long)line, field);
    else if (!strcmp(err, "not a string"))
        str_printf(e, "%s:%lld: field \"%s\" is not a string\n", name, (long long)line, field);
    else if (col == 1) str_printf(e, "%s:%lld: %s\n", name, (long long)line, err);
    else str_printf(e, "%s:%lld: malformed JSON: %s at column %zu\n", name, (long long)line, err, col);
    c->bad++;
}

static void chunk_process(Shared *sh, Worker *ws, Chunk *c, const char *name) {
    BpeScratch *s = ws->s;
    int kind = files[c->file].kind;
    if (kind == IN_TXT && !sh->paragraphs) return txt_document(sh, s, c, c->data, c->len);
    int64_t line = c->line0;
    const char *p = c->data, *end = c->data + c->len, *para = NULL, *para_end = NULL;
    for (; p < end; line++) {
        const char *nl = memchr(p, '\n', end - p), *e = nl ? nl : end;
        if (kind == IN_TXT) { // paragraphs: runs of non-blank lines
            if (!blank(p, e - p)) {
                if (!para) para = p;
                para_end = e;
            } else if (para) txt_document(sh, s, c, para, para_end - para), para = NULL;
        } else if (!blank(p, e - p)) {
            size_t n = e - p, fixed_len, col;
            char *fixed = bpe_utf8_repair(p, n, &fixed_len);
            const char *text = fixed ? fixed : p, *field = prompt_completion ? "prompt" : sh->field;
            n = fixed ? fixed_len : n;
            const char *err = json_line_field(text, n, field, &ws->text, &ws->key, &col);
            if (!err && prompt_completion)
                err = json_line_field(text, n, field = "completion", &ws->completion, &ws->key, &col);
            if (err) line_error(c, name, line, field, err, col);
            else chunk_document(sh, s, c, ws->text.p, ws->text.n, prompt_completion ? &ws->completion : NULL);
            c->repaired += !err && fixed;
            free(fixed);
            if (c->bad && sh->fail_fast) return;
        }
        p = e + 1;
    }
    if (para) txt_document(sh, s, c, para, para_end - para);
}

static void *worker_main(void *arg) {
    Shared *sh = arg;
    Worker ws = {.s = bpe_scratch_new(sh->tok)};
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->work_head && !sh->stop) pthread_cond_wait(&sh->work_cv, &sh->mu);
        if (!sh->work_head) break;
        Chunk *c = sh->work_head;
        sh->work_head = c->next;
        if (!sh->work_head) sh->work_tail = NULL;
        pthread_mutex_unlock(&sh->mu);
        chunk_process(sh, &ws, c, files[c->file].path);
        pthread_mutex_lock(&sh->mu);
        c->next = sh->done, sh->done = c;
        pthread_cond_signal(&sh->done_cv);
    }
    pthread_mutex_unlock(&sh->mu);
    bpe_scratch_free(ws.s), free(ws.text.p), free(ws.key.p), free(ws.completion.p);
    return NULL;
}

// ---- reader: files → chunks ---------------------------------------------------------------------------------------

typedef struct {
    int file; // index of the open file, -1 when none
    FILE *f;
    ZSTD_DStream *z;
    size_t zlast; // last ZSTD_decompressStream result: 0 at a frame end
    ZSTD_inBuffer in;
    z_stream *gz; // .jsonl.gz: zlib's gzip decoder
    bool gz_end;  // at the end of a gzip member (another may follow, as `cat a.gz b.gz` makes)
    char *inbuf, *buf;
    size_t inbuf_cap;
    size_t len, cap, in_used;
    int64_t seq, line;
    bool eof;
} Reader;

// Reads more text into r->buf; false with *err set on a read or decompression error. A compressed file is read
// into r->inbuf and decoded (zstd, or zlib's gzip) until the text grows.
static bool reader_fill(Reader *r, const char **err) {
    if (r->len + CHUNK_BYTES + 1 > r->cap) r->cap = 2 * (r->len + CHUNK_BYTES + 1), r->buf = xrealloc(r->buf, r->cap);
    if (!r->z && !r->gz) {
        size_t n = fread(r->buf + r->len, 1, CHUNK_BYTES, r->f);
        r->len += n, r->in_used += n;
        if (n == 0) r->eof = true;
        if (ferror(r->f)) return *err = strerror(errno), false;
        return true;
    }
    size_t before = r->len;
    while (r->len == before) {
        if (r->gz ? r->gz->avail_in == 0 : r->in.pos == r->in.size) {
            size_t n = fread(r->inbuf, 1, r->inbuf_cap, r->f);
            r->in_used += n;
            if (ferror(r->f)) return *err = strerror(errno), false;
            if (n == 0) {
                r->eof = true;
                if (r->gz && !r->gz_end) return *err = "truncated gzip data (the file ends inside a member)", false;
                if (r->z && r->zlast) return *err = "truncated zstd data (the file ends inside a frame)", false;
                return true;
            }
            if (r->gz) r->gz->next_in = (Bytef *)r->inbuf, r->gz->avail_in = (uInt)n;
            else r->in.size = n, r->in.pos = 0;
        }
        if (r->z) {
            ZSTD_outBuffer out = {r->buf, r->len + CHUNK_BYTES, r->len};
            r->zlast = ZSTD_decompressStream(r->z, &out, &r->in);
            if (ZSTD_isError(r->zlast)) return *err = ZSTD_getErrorName(r->zlast), false;
            r->len = out.pos;
            continue;
        }
        if (r->gz_end) { // the next member (another may follow, as `cat a.gz b.gz` makes)
            CHECK(inflateReset(r->gz) == Z_OK);
            r->gz_end = false;
        }
        r->gz->next_out = (Bytef *)r->buf + r->len, r->gz->avail_out = CHUNK_BYTES;
        int rc = inflate(r->gz, Z_NO_FLUSH);
        r->len = (char *)r->gz->next_out - r->buf;
        if (rc == Z_STREAM_END) r->gz_end = true;
        else if (rc != Z_OK && rc != Z_BUF_ERROR) return *err = r->gz->msg ? r->gz->msg : "invalid gzip data", false;
    }
    return true;
}

// Bytes of buf[0..len) that end on a document boundary (after the last newline; for paragraphs after the last
// blank line); 0 if none.
static size_t cut_point(const char *buf, size_t len, int kind, bool paragraphs) {
    if (kind == IN_TXT && !paragraphs) return 0;
    for (const char *nl; len && (nl = memrchr(buf, '\n', len)); len = nl - buf) {
        if (kind != IN_TXT) return nl - buf + 1;
        const char *j = nl; // *nl ends a line; is that line blank?
        while (j > buf && (j[-1] == ' ' || j[-1] == '\t' || j[-1] == '\r')) j--;
        if (j > buf && j[-1] == '\n') return nl - buf + 1;
    }
    return 0;
}

static int64_t count_lines(const char *p, size_t n) {
    int64_t k = 0;
    for (const char *e = p + n; (p = memchr(p, '\n', e - p)); p++) k++;
    return k;
}

// Takes the first n bytes of the reader's buffer as a chunk; chunks are reused (with their buffers) from *free_list.
static Chunk *make_chunk(Reader *r, size_t n, Chunk **free_list) {
    Chunk *c = *free_list;
    if (c) *free_list = c->next;
    else c = xcalloc(1, sizeof *c);
    c->ids.n = c->ndocs = c->repaired = c->bad = c->text_bytes = 0, c->errors = (Str){0}, c->next = NULL;
    c->file = r->file, c->seq = r->seq++, c->line0 = r->line, c->len = n, c->in_bytes = r->in_used;
    if (n + 1 > c->cap) c->cap = n + n / 4 + 1, c->data = xrealloc(c->data, c->cap);
    memcpy(c->data, r->buf, n), c->data[n] = 0;
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n, r->in_used = 0;
    r->line += count_lines(c->data, n);
    return c;
}

static void reader_close(Reader *r) {
    if (r->f) fclose(r->f);
    if (r->z) ZSTD_freeDStream(r->z);
    if (r->gz) inflateEnd(r->gz), free(r->gz);
    files[r->file].nchunks = r->seq, files[r->file].read_done = true;
    r->f = NULL, r->z = NULL, r->gz = NULL, r->gz_end = false, r->file = -1, r->len = 0;
}

// ---- writer -------------------------------------------------------------------------------------------------------

// Ends the run on a write error of f's output, its temporary removed (nothing half-written is left).
static _Noreturn void out_die(InFile *f, const char *what) {
    int e = errno;
    if (f->f) fclose(f->f), f->f = NULL;
    unlink(f->tmp);
    die("%s: %s: %s", f->tmp, what, strerror(e));
}

static void out_open(InFile *f) {
    char dir[4096];
    path_dirname(dir, sizeof dir, f->out);
    mkdir_p(dir);
    f->f = fopen(f->tmp, "wb");
    if (!f->f) die("%s: cannot write: %s", f->tmp, strerror(errno));
    setvbuf(f->f, NULL, _IOFBF, 1 << 20);
    // rewritten with the count at the end: the header is 128 bytes for any count
    if (!npy_write_header(f->f, DT_U32, 0)) out_die(f, "write failed");
    CHECK(ftell(f->f) == 128);
}

// Finishes a file whose chunks are all written: splits record, token count, fsync, rename (or removal if
// it failed).
static void out_finish(InFile *f) {
    if (f->failed) {
        if (f->f) fclose(f->f), f->f = NULL, unlink(f->tmp);
        return;
    }
    if (!f->f) out_open(f);
    if (!npy_write_header(f->f, DT_U64, (int64_t)f->nends) ||
        (f->nends && fwrite(f->ends, 8, f->nends, f->f) != f->nends) ||
        (prompt_completion && (!npy_write_header(f->f, DT_U8, (int64_t)f->ntok) ||
                               (f->ntok && fwrite(f->mask, 1, f->ntok, f->f) != f->ntok))) ||
        fseek(f->f, 0, SEEK_SET) || !npy_write_header(f->f, DT_U32, (int64_t)f->ntok) || fflush(f->f) ||
        fsync(fileno(f->f)))
        out_die(f, "write failed");
    FILE *fp = f->f;
    f->f = NULL; // closed here whatever happens: the exit handler must not close it again
    if (fclose(fp)) out_die(f, "write failed");
    if (rename(f->tmp, f->out)) out_die(f, "cannot rename to its final name");
    free(f->ends), free(f->mask), f->ends = NULL, f->mask = NULL;
}

typedef struct {
    uint64_t docs, tokens, text_bytes, in_bytes, bad, repaired;
    uint64_t warned;              // bad-line warnings shown (at most WARN_CAP; tot.bad - warned are only counted)
    int written, failed, all_bad; // all_bad: files with lines, every one of them bad (no output)
    const char *first_all_bad;
} Totals;

static void write_chunk(InFile *f, Chunk *c, Totals *tot, bool fail_fast) {
    if (c->errors.n) {
        if (fail_fast) { // one line: the first error
            *strchr(c->errors.p, '\n') = 0;
            die("%s (--on-error skip skips bad documents)", c->errors.p);
        }
        for (char *m = c->errors.p, *nl; (nl = strchr(m, '\n')) && tot->warned < WARN_CAP; m = nl + 1)
            *nl = 0, warn("%s (skipped)", m), tot->warned++;
    }
    f->bad += c->bad;
    if (!f->failed) {
        if (!f->f) out_open(f);
        if (c->ids.n && fwrite(c->ids.p, 4, c->ids.n, f->f) != c->ids.n) out_die(f, "write failed"); // (p NULL if 0)
        if (f->nends + c->ndocs > f->ends_cap)
            f->ends_cap = 2 * (f->nends + c->ndocs), f->ends = xrealloc(f->ends, f->ends_cap * 8);
        for (size_t i = 0; i < c->ndocs; i++) f->ends[f->nends++] = f->ntok + c->ends[i];
        if (prompt_completion && c->ids.n)
            f->mask = xrealloc(f->mask, f->ntok + c->ids.n), memcpy(f->mask + f->ntok, c->mask, c->ids.n);
        f->ntok += c->ids.n;
        tot->docs += c->ndocs, tot->tokens += c->ids.n, tot->bad += c->bad, tot->repaired += c->repaired;
    }
    tot->text_bytes += c->text_bytes, tot->in_bytes += c->in_bytes;
    f->written++;
}

// Progress on stderr. On a terminal: one line rewritten in place twice a second. Otherwise (a log file, a
// pipe): a plain line whenever another tenth of the input is done, and at least once a minute.
static void progress(const Totals *t, uint64_t total_in, double t0, bool tty) {
    static double last;
    static int last_tenth;
    double now = now_seconds(), dt = now - t0;
    int tenth = total_in ? (int)(10 * t->in_bytes / total_in) : 10;
    if (!last) last = t0;
    if (tty ? now - last < 0.5 : tenth <= last_tenth && now - last < 60) return;
    last = now, last_tenth = tenth;
    double rate = t->text_bytes / 1e6 / (dt > 1e-9 ? dt : 1e-9), in_rate = t->in_bytes / (dt > 1e-9 ? dt : 1e-9);
    double eta = in_rate > 0 && total_in > t->in_bytes ? (total_in - t->in_bytes) / in_rate : 0;
    fprintf(stderr, "%stokenize: %llu documents, %llu tokens, %.1f MB/s, %3.0f%%, ETA %d:%02d%s", tty ? "\r" : "",
            (unsigned long long)t->docs, (unsigned long long)t->tokens, rate,
            100.0 * t->in_bytes / (total_in ? total_in : 1), (int)eta / 60, (int)eta % 60, tty ? "   " : "\n");
}

// ---- command ------------------------------------------------------------------------------------------------------

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: pith tokenize --tokenizer PATH --input PATH [PATH ...] --output DIR [options]\n"
            "  Tokenizes text into PithTrain token files: each input file becomes DIR/<relative path>.bin holding two\n"
            "  .npy records: uint32 token ids (each document followed by EOS) and uint64 cumulative document ends.\n"
            "  --tokenizer PATH   a Hugging Face tokenizer.json, or a folder holding tokenizer.json (and\n"
            "                     tokenizer_config.json, which names EOS/BOS and whether BOS is prepended)\n"
            "  --input PATH ...   files or folders (searched recursively; hidden entries skipped) of .jsonl,\n"
            "                     .jsonl.zst/.jsonl.zstd, .jsonl.gz (one JSON object per line) and .txt files\n"
            "  --format FORMAT    jsonl, jsonl.zst, jsonl.gz or txt: read every input file as FORMAT whatever its\n"
            "                     name (folders then give all their files), instead of by extension;\n"
            "                     prompt-completion: JSON lines (by extension) with string fields prompt and\n"
            "                     completion, one document each; a third record, the uint8 loss mask, marks the\n"
            "                     prompt's tokens 0 (not targets), the completion's and EOS 1\n"
            "  --output DIR       where the .bin files go (mirroring paths relative to each input folder)\n"
            "  --workers N        tokenizer threads (default: all CPUs); the output does not depend on N\n"
            "  --eos TOKEN        end-of-document token, as a token string or an integer id\n"
            "                     (default: <|endoftext|> where the vocabulary has one, the base-model document\n"
            "                     separator; else eos_token of tokenizer_config.json)\n"
            "  --field NAME       the JSON field that holds a document's text (default: text)\n"
            "  --txt-split MODE   file: a .txt file is one document (default); paragraph: each run of non-blank\n"
            "                     lines is a document\n"
            "  --on-error MODE    fail: stop at the first bad line or file (default); skip: warn, leave the bad\n"
            "                     line (or, for an unreadable or truncated file, the whole file) out and go on\n"
            "  Invalid UTF-8 is replaced by U+FFFD. Added tokens (e.g. <|endoftext|>) in the text are encoded as\n"
            "  such. Outputs are written as NAME.bin.tmp and renamed when complete; outputs that exist are skipped,\n"
            "  so an interrupted run can be re-run. Progress goes to stderr: one line updated in place on a\n"
            "  terminal, else a line per tenth of the input. With --on-error skip the first 20 bad lines are\n"
            "  named and the rest counted; a file whose every line is bad gets no output and the exit status is 1.\n");
}

// The command line of pith tokenize.
typedef struct {
    const char *tokpath, *outdir, *eos_arg, *field, *split, *on_error;
    const char **inputs;
    int ninputs;
    long workers;
} TokArgs;

// Parses and checks the command line into a. Returns -1 to go on, else the exit status (--help, an unknown option).
static int tokenize_args(TokArgs *a, int argc, char **argv) {
    static struct option opts[] = {{"tokenizer", 1, 0, 't'},
                                   {"input", 1, 0, 'i'},
                                   {"output", 1, 0, 'o'},
                                   {"workers", 1, 0, 'w'},
                                   {"eos", 1, 0, 'e'},
                                   {"field", 1, 0, 'f'},
                                   {"txt-split", 1, 0, 's'},
                                   {"on-error", 1, 0, 'r'},
                                   {"format", 1, 0, 'F'},
                                   {"help", 0, 0, 'h'},
                                   {0}};
    *a = (TokArgs){.field = "text",
                   .split = "file",
                   .on_error = "fail",
                   .inputs = xcalloc(argc + 1, sizeof *a->inputs),
                   .workers = sysconf(_SC_NPROCESSORS_ONLN)};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': a->tokpath = optarg; break;
        case 'i': a->inputs[a->ninputs++] = optarg; break;
        case 'o': a->outdir = optarg; break;
        case 'w': a->workers = arg_int("tokenize", "--workers", optarg, 1, 1024); break;
        case 'e': a->eos_arg = optarg; break;
        case 'f': a->field = optarg; break;
        case 's': a->split = optarg; break;
        case 'r': a->on_error = optarg; break;
        case 'F':
            for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
                if (!strcmp(formats[i].ext + 1, optarg)) forced_kind = formats[i].kind;
            prompt_completion = !strcmp(optarg, "prompt-completion");
            if (forced_kind < 0 && !prompt_completion)
                die("tokenize: --format must be jsonl, jsonl.zst, jsonl.gz or txt (got '%s'), or prompt-completion for "
                    "prompt/completion pairs",
                    optarg);
            break;
        case 'h': tokenize_usage(stdout), free(a->inputs); return 0;
        default: arg_suggest_option(opts, argv), tokenize_usage(stderr), free(a->inputs); return 2;
        }
    }
    for (int i = optind; i < argc; i++) a->inputs[a->ninputs++] = argv[i]; // the rest of --input PATH PATH ...
    if (!a->tokpath) die("tokenize: --tokenizer is required (pith tokenize --help)");
    if (!a->ninputs) die("tokenize: --input is required (pith tokenize --help)");
    if (!a->outdir) die("tokenize: --output is required (pith tokenize --help)");
    if (strcmp(a->split, "file") && strcmp(a->split, "paragraph"))
        die("tokenize: --txt-split must be file or paragraph (got '%s')", a->split);
    if (strcmp(a->on_error, "fail") && strcmp(a->on_error, "skip"))
        die("tokenize: --on-error must be fail or skip (got '%s')", a->on_error);
    if (prompt_completion && strcmp(a->field, "text"))
        die("tokenize: --field does not apply to --format prompt-completion (its fields are prompt and completion)");
    return -1;
}

// The input files of every --input path (folders searched), in order of their relative paths, each with its own
// output.
static void collect_inputs(const TokArgs *a) {
    for (int i = 0; i < a->ninputs; i++) {
        const char *in = a->inputs[i];
        if (!path_exists(in)) die("%s: no such file or directory", in);
        if (path_is_dir(in)) {
            int before = nfiles;
            walk_dir(in, "", a->outdir);
            if (nfiles == before) warn("%s: no .jsonl, .jsonl.zst, .jsonl.gz or .txt files in this folder", in);
            continue;
        }
        if (input_kind(in) < 0)
            die("%s: unsupported input (expected .jsonl, .jsonl.zst, .jsonl.zstd, .jsonl.gz or .txt; "
                "--format says which)",
                in);
        const char *base = strrchr(in, '/');
        add_file(in, base ? base + 1 : in, a->outdir);
    }
    qsort(files, nfiles, sizeof *files, cmp_rel);
    for (int i = 0; i < nfiles && prompt_completion; i++)
        if (files[i].kind == IN_TXT)
            die("%s: --format prompt-completion reads JSON lines (.jsonl, .jsonl.zst, .jsonl.gz), not .txt",
                files[i].path);
    for (int i = 1; i < nfiles; i++)
        if (!strcmp(files[i].rel, files[i - 1].rel))
            die("%s and %s would both be written to %s", files[i - 1].path, files[i].path, files[i].out);
}

// The document separator. Base-model pretraining separates documents with <|endoftext|> where the
// vocabulary has it (Qwen, GPT-OSS): their tokenizer_config.json's eos_token is the end of a chat turn
// (<|im_end|>, <|return|>), which a base model should not learn between documents. Other vocabularies
// (DeepSeek's <｜end▁of▁sentence｜>) use tokenizer_config.json's eos_token, as PithTrain does.
static int64_t choose_eos(const Bpe *tok, const char *eos_arg, const char *tokpath) {
    int64_t eos = -1;
    if (eos_arg) {
        char *end;
        long long v = strtoll(eos_arg, &end, 10);
        eos = *eos_arg && !*end ? v : bpe_token_to_id(tok, eos_arg);
        if (eos < 0 || eos >= bpe_num_ids(tok)) die("tokenize: --eos '%s' is not a token of %s", eos_arg, tokpath);
        size_t n;
        char *text = bpe_decode(tok, &(uint32_t){(uint32_t)eos}, 1, &n);
        if (!(n >= 2 && text[0] == '<' && text[n - 1] == '>'))
            warn("tokenize: --eos '%s' (id %lld, \"%.*s\") is an ordinary token, not a special one like <|endoftext|>: "
                 "documents will be separated by text",
                 eos_arg, (long long)eos, (int)(n < 40 ? n : 40), text);
        free(text);
    } else if ((eos = bpe_token_to_id(tok, "<|endoftext|>")) >= 0) {
        const char *name = bpe_config_token(tok, "eos_token");
        bool other = name && strcmp(name, "<|endoftext|>");
        fprintf(stderr, "tokenize: EOS <|endoftext|> (id %lld), the document separator of this vocabulary%s%s%s\n",
                (long long)eos, other ? " (tokenizer_config.json's eos_token " : "", other ? name : "",
                other ? " ends a chat turn; --eos chooses)" : "");
    } else {
        const char *name = bpe_config_token(tok, "eos_token");
        if (!name)
            die("tokenize: %s has no eos_token in tokenizer_config.json and no <|endoftext|>; pass --eos TOKEN",
                tokpath);
        eos = bpe_token_to_id(tok, name);
        if (eos < 0) die("tokenize: eos_token '%s' of tokenizer_config.json is not in the vocabulary", name);
    }
    return eos;
}

// ---- the main thread: read, hand out, write in order ----------------------------------------------------------------

// The main thread's reader, the chunks between it, the workers and the writer, and the totals written.
typedef struct {
    Shared *sh;
    Reader r;
    Chunk *pending, *free_chunks; // results waiting for their turn to be written; chunks to reuse
    Totals tot;
    // inflight: chunks made and not yet written (bounds memory even when one slow chunk holds up the writer);
    // to_write: the first file not yet finished
    int next_file, inflight, max_inflight, to_write;
    bool stop_reading; // a file failed and --on-error fail
} Pump;

// The reader's file fails with msg (the writer reports it, in file order); under --on-error fail reading stops.
static void read_failed(Pump *p, const char *msg) {
    InFile *f = &files[p->r.file];
    f->failed = true, f->error = xstrdup(msg), p->stop_reading = p->sh->fail_fast;
    reader_close(&p->r);
}

// Opens the next file for reading. A skipped one (its output exists) counts as read and one that cannot be opened
// fails: the reader then stays closed (r.file < 0).
static void open_next(Pump *p) {
    Reader *r = &p->r;
    InFile *f = &files[p->next_file];
    if (f->skip) {
        f->read_done = true, p->next_file++;
        return;
    }
    r->file = p->next_file++, r->seq = 0, r->line = 1, r->eof = false, r->zlast = 0,
    r->in = (ZSTD_inBuffer){r->inbuf, 0, 0};
    r->f = fopen(f->path, "rb");
    if (r->f && f->kind == IN_JSONL_ZST) r->z = ZSTD_createDStream(), ZSTD_initDStream(r->z);
    if (r->f && f->kind == IN_JSONL_GZ) { // 15 + 16: the largest window, gzip framing only
        r->gz = xcalloc(1, sizeof *r->gz);
        CHECK(inflateInit2(r->gz, 15 + 16) == Z_OK);
    }
    if (!r->f) {
        char msg[4200];
        snprintf(msg, sizeof msg, "%s: cannot read: %s", f->path, strerror(errno));
        read_failed(p, msg);
    }
}

// Cuts chunks and queues them for the workers until enough are in flight or nothing is left to read.
static void read_chunks(Pump *p) {
    Reader *r = &p->r;
    Shared *sh = p->sh;
    while (p->inflight < p->max_inflight && (r->file >= 0 || p->next_file < nfiles) && !p->stop_reading) {
        if (r->file < 0 && (open_next(p), r->file < 0)) continue;
        const char *err = NULL;
        size_t cut = r->len >= CHUNK_BYTES ? cut_point(r->buf, r->len, files[r->file].kind, sh->paragraphs) : 0;
        Chunk *ck = NULL;
        if (cut) ck = make_chunk(r, cut, &p->free_chunks);
        else if (r->eof) {
            if (r->len) ck = make_chunk(r, r->len, &p->free_chunks);
            reader_close(r);
        } else if (!reader_fill(r, &err)) {
            char msg[4200];
            snprintf(msg, sizeof msg, "%s: %s (after line %lld)", files[r->file].path, err,
                     (long long)(r->line + count_lines(r->buf, r->len) - 1));
            read_failed(p, msg);
        }
        if (ck) {
            pthread_mutex_lock(&sh->mu);
            if (sh->work_tail) sh->work_tail->next = ck;
            else sh->work_head = ck;
            sh->work_tail = ck, p->inflight++;
            pthread_cond_signal(&sh->work_cv);
            pthread_mutex_unlock(&sh->mu);
        }
    }
}

// Takes the workers' finished chunks; waits for one when no more can be read now.
static void collect_done(Pump *p) {
    Shared *sh = p->sh;
    bool can_read = (p->r.file >= 0 || p->next_file < nfiles) && !p->stop_reading;
    pthread_mutex_lock(&sh->mu);
    while (!sh->done && p->inflight > 0 && (p->inflight >= p->max_inflight || !can_read))
        pthread_cond_wait(&sh->done_cv, &sh->mu);
    for (Chunk *d = sh->done, *nx; d; d = nx) nx = d->next, d->next = p->pending, p->pending = d;
    sh->done = NULL;
    pthread_mutex_unlock(&sh->mu);
}

// Writes the pending chunks in file order and chunk order, and finishes each file whose chunks are all written.
static void write_ready(Pump *p) {
    Totals *tot = &p->tot;
    for (bool progressed = true; progressed && p->to_write < nfiles;) {
        progressed = false;
        InFile *f = &files[p->to_write];
        for (Chunk **pp = &p->pending; *pp; pp = &(*pp)->next)
            if ((*pp)->file == p->to_write && (*pp)->seq == f->written) {
                Chunk *ck = *pp;
                *pp = ck->next;
                write_chunk(f, ck, tot, p->sh->fail_fast);
                free(ck->errors.p), ck->next = p->free_chunks, p->free_chunks = ck, p->inflight--;
                progressed = true;
                break;
            }
        if (!f->read_done || f->written != f->nchunks) continue;
        if (f->failed && p->sh->fail_fast) die("%s", f->error);
        if (!f->failed && f->bad && !f->nends) { // --on-error skip, and not one line was good
            f->failed = true, tot->all_bad++, tot->failed++;
            if (!tot->first_all_bad) tot->first_all_bad = f->path;
            warn("%s: every line (%llu) was bad: no output", f->path, (unsigned long long)f->bad);
        } else if (f->failed) warn("%s (file skipped)", f->error), tot->failed++;
        if (f->failed) tot->docs -= f->nends, tot->tokens -= f->ntok; // counted while its chunks were written
        if (!f->skip) out_finish(f), tot->written += !f->failed;
        p->to_write++, progressed = true;
    }
}

// Every file through `workers` tokenizer threads; returns the seconds it took, the totals in *tot.
static double tokenize_files(Shared *sh, long workers, uint64_t total_in, Totals *tot) {
    pthread_mutex_init(&sh->mu, NULL), pthread_cond_init(&sh->work_cv, NULL), pthread_cond_init(&sh->done_cv, NULL);
    pthread_t *th = xmalloc(workers * sizeof *th);
    for (long i = 0; i < workers; i++) CHECK(pthread_create(&th[i], NULL, worker_main, sh) == 0);
    Pump p = {.sh = sh, .max_inflight = 2 * (int)workers + 2};
    p.r = (Reader){.file = -1, .inbuf = xmalloc(ZSTD_DStreamInSize()), .inbuf_cap = ZSTD_DStreamInSize()};
    bool tty = isatty(2);
    double t0 = now_seconds();
    while (p.to_write < nfiles) {
        read_chunks(&p), collect_done(&p), write_ready(&p);
        progress(&p.tot, total_in, t0, tty);
    }
    pthread_mutex_lock(&sh->mu);
    sh->stop = true;
    pthread_cond_broadcast(&sh->work_cv);
    pthread_mutex_unlock(&sh->mu);
    for (long i = 0; i < workers; i++) pthread_join(th[i], NULL);
    if (tty) fprintf(stderr, "\r%100s\r", ""); // the summary replaces the progress line
    for (Chunk *ck; (ck = p.free_chunks);)
        p.free_chunks = ck->next, free(ck->data), idvec_free(&ck->ids), free(ck->ends), free(ck->mask), free(ck);
    free(th), free(p.r.inbuf), free(p.r.buf);
    *tot = p.tot;
    return now_seconds() - t0;
}

// The summary line; bad lines beyond those named; a file whose every line was bad ends the run (status 1).
static void report(const Totals *tot, int nskip, double dt, long workers) {
    printf("tokenize: %d files written, %d skipped (output exists), %d failed; %llu documents, %llu tokens, "
           "%.1f MB of text in %.2f s (%.1f MB/s, %ld workers)",
           tot->written, nskip, tot->failed, (unsigned long long)tot->docs, (unsigned long long)tot->tokens,
           tot->text_bytes / 1e6, dt, tot->text_bytes / 1e6 / (dt > 1e-9 ? dt : 1e-9), workers);
    if (tot->bad) printf("; %llu bad lines skipped", (unsigned long long)tot->bad);
    if (tot->repaired) printf("; invalid UTF-8 replaced in %llu documents", (unsigned long long)tot->repaired);
    printf("\n");
    fflush(stdout);
    if (tot->bad > tot->warned)
        warn("tokenize: ... and %llu more bad lines (the first %d are shown above; %llu in all)",
             (unsigned long long)(tot->bad - tot->warned), WARN_CAP, (unsigned long long)tot->bad);
    if (tot->all_bad)
        die("tokenize: every line of %d input file%s was bad (%s%s): nothing was written for %s", tot->all_bad,
            tot->all_bad == 1 ? "" : "s", tot->first_all_bad, tot->all_bad > 1 ? ", ..." : "",
            tot->all_bad == 1 ? "it" : "them");
}

int cmd_tokenize(int argc, char **argv) {
    TokArgs a;
    int rc = tokenize_args(&a, argc, argv);
    if (rc >= 0) return rc;
    collect_inputs(&a);
    Bpe *tok = bpe_load(a.tokpath);
    int64_t eos = choose_eos(tok, a.eos_arg, a.tokpath);
    uint64_t total_in = 0;
    int nskip = 0;
    for (int i = 0; i < nfiles; i++) {
        files[i].skip = path_exists(files[i].out);
        if (files[i].skip) nskip++;
        else total_in += files[i].size;
    }
    if (nskip == nfiles) { // a rerun after a finished one: say so, rather than a progress line of zeros
        printf("tokenize: all %d outputs already exist under %s: nothing to do (delete them to redo)\n", nfiles,
               a.outdir);
        bpe_free(tok), free(a.inputs);
        return 0;
    }
    if (nskip)
        fprintf(stderr, "tokenize: %d of %d outputs already exist; skipping them (delete them to redo)\n", nskip,
                nfiles);
    atexit(remove_partial_outputs);
    Shared sh = {.tok = tok, .field = a.field, .eos = (uint32_t)eos};
    sh.paragraphs = !strcmp(a.split, "paragraph"), sh.fail_fast = !strcmp(a.on_error, "fail");
    Totals tot;
    double dt = tokenize_files(&sh, a.workers, total_in, &tot);
    report(&tot, nskip, dt, a.workers);
    bpe_free(tok), free(a.inputs);
    return 0;
}

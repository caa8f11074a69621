// bpe.c — byte-level BPE tokenizer that reads a Hugging Face tokenizer.json and encodes as HF `tokenizers` does.
// Pipeline for one text (HF's AddedVocabulary + Tokenizer::encode):
//   1. invalid UTF-8 → U+FFFD (maximal subparts, as from_utf8_lossy);
//   2. split off added tokens with normalized=false (leftmost-longest match on the raw text);
//   3. normalize each remaining segment (utf8proc NFC/NFD/NFKC/NFKD), then split off added tokens with normalized=true;
//   4. pre-tokenize each piece: Split steps (PCRE2, UTF+UCP, JIT; `\s` rewritten to Unicode White_Space as Oniguruma
//      has it) and ByteLevel (its GPT-2 regex when use_regex); the byte→char mapping of ByteLevel is implicit because
//      the vocabulary is stored as raw bytes;
//   5. BPE on each word: whole-word vocabulary hit with ignore_merges, else repeated merging of the adjacent pair of
//      lowest merge rank (leftmost on ties): a linear scan for short words, a binary heap over a linked list of symbols
//      for long ones (O(n log n): a 1 MB run of one character is fine). A per-thread cache holds short words' ids.
// Shapes: a vocabulary of V ids (≤ 2^32), merges as a hash map (left id, right id) → (rank, merged id).
#include "base/bpe.h"

#include <pthread.h>
#include <utf8proc.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/json.h"

size_t bpe_heap_min_len = 48;
bool bpe_ascii_regex = true;

enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };

typedef struct {
    pcre2_code *re, *ascii; // ascii: the same split for text without bytes >= 0x80, or NULL
    bool jit, ascii_jit;
    int behavior;
    bool invert;
} PreStep;

typedef struct {
    uint64_t key; // UINT64_MAX: empty
    uint32_t rank, new_id;
} MergeSlot;

typedef struct {
    char *content;
    uint32_t len, id;
    bool lstrip, rstrip, single_word, normalized;
} Added;

struct Bpe {
    char file[4096];
    int64_t nids;
    // Vocabulary: id → raw bytes (blob[off[id]] .. + len[id]; len = UINT32_MAX for an unused id), bytes → id (hash).
    uint8_t *blob;
    size_t blob_len, blob_cap;
    uint64_t *off;
    uint32_t *len;
    uint32_t *vslot; // open addressing: id + 1, 0 = empty
    uint64_t vmask;
    uint32_t byte_id[256];
    // Merges: key (left << 32 | right) → rank, merged id, in one 16-byte slot (one cache miss per lookup).
    MergeSlot *merges;
    uint64_t mmask;
    bool ignore_merges, bytelevel; // bytelevel: the pre-tokenizer has a ByteLevel step
    // Added tokens; per class (0: normalized=false, 1: normalized=true) sorted by (first byte, length desc).
    Added *added;
    int nadded;
    int32_t *added_of_id; // id → index in added, or -1
    int *aorder[2];
    int abucket[2][257]; // aorder[c][abucket[c][b] .. abucket[c][b+1]) start with byte b
    int afirst[2];       // the first byte all added tokens of class c share (then memchr finds them), or -1
    int norm[4];         // utf8proc options applied in turn
    int nnorm;
    PreStep steps[8];
    int nsteps;
    uint32_t prefix[8], suffix[8];
    int nprefix, nsuffix;
    char *bos, *eos;
};

// ---- small helpers ------------------------------------------------------------------------------------------------

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
    return x;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n, w = 0;
    for (; n >= 8; p += 8, n -= 8) memcpy(&w, p, 8), h = (h ^ w) * 0x100000001b3ull, h ^= h >> 29;
    for (w = 0; n > 0; n--) w = w << 8 | p[n - 1];
    return mix64(h ^ w);
}

void idvec_push(IdVec *v, uint32_t id) {
    if (v->n == v->cap) v->cap = 2 * v->cap + 256, v->p = xrealloc(v->p, v->cap * sizeof *v->p);
    v->p[v->n++] = id;
}

void idvec_free(IdVec *v) {
    free(v->p);
    *v = (IdVec){0};
}

// Length of the ASCII prefix of s[0..n), 8 bytes at a time.
static size_t ascii_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    for (uint64_t w; i + 8 <= n && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull));) i += 8;
    while (i < n && s[i] < 0x80) i++;
    return i;
}

// GPT-2's byte ↔ character map of ByteLevel: printable bytes map to themselves, the others to U+0100 + k in order.
static int byte_char[256], char_byte[512];
static void bytelevel_tables(void) {
    int k = 0;
    for (int i = 0; i < 512; i++) char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        byte_char[b] = keep ? b : 256 + k++;
        char_byte[byte_char[b]] = b;
    }
}

// Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid; *bad gets how many bytes form the maximal invalid
// subpart (a lead byte and the continuation bytes that still fit it) so that one U+FFFD replaces them.
static size_t utf8_seq(const uint8_t *s, size_t n, size_t *bad) {
    uint8_t b = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b >= 0xE0 && b <= 0xEF) need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    else return *bad = 1, 0;
    for (size_t k = 1; k <= need; k++) {
        if (k >= n || s[k] < (k == 1 ? lo : 0x80) || s[k] > (k == 1 ? hi : 0xBF)) return *bad = k, 0;
    }
    return need + 1;
}

char *bpe_utf8_repair(const char *text, size_t n, size_t *out_len) {
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0, bad, k;
    // the common case: valid UTF-8, mostly ASCII
    while ((i += ascii_prefix(s + i, n - i)) < n && (k = utf8_seq(s + i, n - i, &bad))) i += k;
    if (i == n) return NULL;
    char *out = xmalloc(3 * n + 1);
    size_t o = i;
    memcpy(out, s, i);
    while (i < n) {
        k = utf8_seq(s + i, n - i, &bad);
        if (k) memcpy(out + o, s + i, k), o += k, i += k;
        else memcpy(out + o, "\xEF\xBF\xBD", 3), o += 3, i += bad;
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

// Decodes the code point at s (valid UTF-8 assumed); returns its byte length.
static int utf8_decode(const uint8_t *s, int32_t *cp) {
    if (s[0] < 0x80) return *cp = s[0], 1;
    if (s[0] < 0xE0) return *cp = (s[0] & 31) << 6 | (s[1] & 63), 2;
    if (s[0] < 0xF0) return *cp = (s[0] & 15) << 12 | (s[1] & 63) << 6 | (s[2] & 63), 3;
    return *cp = (s[0] & 7) << 18 | (s[1] & 63) << 12 | (s[2] & 63) << 6 | (s[3] & 63), 4;
}

static bool is_white_space(int32_t c) { // Unicode White_Space (Rust's char::is_whitespace)
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// NFC quick check (after UAX #15): nfc_safe has a bit for each code point that NFC leaves alone whatever surrounds it:
// assigned, combining class 0, not a mark (every character that can be the second of a canonical composition is a
// mark or a Hangul jamo), not a jamo, and NFC of the character alone is itself (which rules out singletons and
// composition exclusions). Text made of such characters only is already in NFC.
static uint8_t nfc_safe[0x110000 / 8];
static pthread_once_t nfc_once = PTHREAD_ONCE_INIT;

static void nfc_tables(void) {
    for (int32_t c = 0; c < 0x110000; c++) {
        const utf8proc_property_t *p = utf8proc_get_property(c);
        if (p->category == UTF8PROC_CATEGORY_CN || p->category == UTF8PROC_CATEGORY_CS || p->combining_class ||
            (p->category >= UTF8PROC_CATEGORY_MN && p->category <= UTF8PROC_CATEGORY_ME) ||
            (c >= 0x1100 && c <= 0x11FF) || (c >= 0xA960 && c <= 0xA97F) || (c >= 0xD7B0 && c <= 0xD7FF))
            continue;
        if (p->decomp_seqindex != UINT16_MAX) { // has a decomposition: safe if NFC gives the character back
            uint8_t enc[4], *dst = NULL;
            utf8proc_ssize_t k = utf8proc_encode_char(c, enc),
                             r = utf8proc_map(enc, k, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            bool same = r == k && !memcmp(dst, enc, k);
            free(dst);
            if (!same) continue;
        }
        nfc_safe[c >> 3] |= (uint8_t)(1 << (c & 7));
    }
}

// True if NFC leaves s[0..n) (valid UTF-8) unchanged by the quick check; false means "maybe not".
static bool nfc_quick(const uint8_t *s, size_t n) {
    for (size_t i = ascii_prefix(s, n); i < n; i += ascii_prefix(s + i, n - i)) {
        int32_t cp;
        if (s[i] < 0xCC) { // below U+0300 every character is safe
            i += 2;
            continue;
        }
        i += (size_t)utf8_decode(s + i, &cp);
        if (!(nfc_safe[cp >> 3] >> (cp & 7) & 1)) return false;
    }
    return true;
}

// ---- vocabulary and merges ----------------------------------------------------------------------------------------

static int64_t vocab_find(const Bpe *t, const uint8_t *s, size_t n) {
    for (uint64_t h = hash_bytes(s, n) & t->vmask;; h = (h + 1) & t->vmask) {
        uint32_t v = t->vslot[h];
        if (!v) return -1;
        if (t->len[v - 1] == n && memcmp(t->blob + t->off[v - 1], s, n) == 0) return v - 1;
    }
}

// Converts a token as written in tokenizer.json (ByteLevel characters) to raw bytes; false if some character is not
// in the ByteLevel map (then out holds the token's own UTF-8 bytes, as HF's ByteLevel decoder falls back to).
static bool bytelevel_to_bytes(const char *tok, uint8_t *out, size_t *n) {
    const uint8_t *s = (const uint8_t *)tok;
    size_t len = strlen(tok), o = 0, bad;
    for (size_t i = 0; i < len;) {
        int32_t cp;
        if (!utf8_seq(s + i, len - i, &bad)) break;
        i += utf8_decode(s + i, &cp);
        if (cp >= 512 || char_byte[cp] < 0) {
            memcpy(out, tok, len), *n = len;
            return false;
        }
        out[o++] = (uint8_t)char_byte[cp];
    }
    *n = o;
    return true;
}

static void vocab_set(Bpe *t, int64_t id, const uint8_t *s, size_t n) {
    if (t->blob_len + n > t->blob_cap) t->blob_cap = 2 * (t->blob_len + n), t->blob = xrealloc(t->blob, t->blob_cap);
    memcpy(t->blob + t->blob_len, s, n);
    t->off[id] = t->blob_len, t->len[id] = (uint32_t)n;
    t->blob_len += n;
}

static inline bool merge_get(const Bpe *t, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *new_id) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (uint64_t h = mix64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        const MergeSlot *m = &t->merges[h];
        if (m->key == key) return *rank = m->rank, *new_id = m->new_id, true;
        if (m->key == UINT64_MAX) return false;
    }
}

// Token ids are below 2^24 (the largest Hugging Face vocabularies hold a few hundred thousand): an id beyond it is
// a mistake, not a vocabulary, and would size the id tables by it.
#define BPE_MAX_IDS (1LL << 24)

static void load_vocab_and_merges(Bpe *t, JObj model, json_t *added) {
    json_t *vocab = json_object_get(model.obj, "vocab"), *merges = json_object_get(model.obj, "merges");
    if (!json_is_object(vocab)) jdie(model, "vocab", "expected an object of token → id");
    if (!json_is_array(merges)) jdie(model, "merges", "expected an array");
    int64_t nids = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= BPE_MAX_IDS)
            jdie(model, "vocab", "token '%s' has no valid id (expected an id in [0, 2^24))", key);
        if (json_integer_value(val) >= nids) nids = json_integer_value(val) + 1;
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= BPE_MAX_IDS)
            die("%s: added_tokens[%zu].id: expected an id in [0, 2^24) (got %s)", t->file, i,
                json_is_integer(id) ? "a larger one" : "no integer");
        if (json_integer_value(id) >= nids) nids = json_integer_value(id) + 1;
    }
    t->nids = nids;
    t->off = xcalloc(nids, sizeof *t->off);
    t->len = xmalloc(nids * sizeof *t->len);
    for (int64_t k = 0; k < nids; k++) t->len[k] = UINT32_MAX;
    uint64_t cap = 1;
    while (cap < 2 * (uint64_t)json_object_size(vocab) + 2) cap *= 2;
    t->vslot = xcalloc(cap, sizeof *t->vslot), t->vmask = cap - 1;
    uint8_t *buf = xmalloc(4 * 1024 * 1024);
    json_object_foreach(vocab, key, val) {
        size_t n;
        if (strlen(key) >= 4 * 1024 * 1024) jdie(model, "vocab", "token too long");
        bool mapped = bytelevel_to_bytes(key, buf, &n);
        int64_t id = json_integer_value(val);
        vocab_set(t, id, buf, n);
        if (!mapped || vocab_find(t, buf, n) >= 0) continue; // unreachable by encoding (as in HF)
        uint64_t h = hash_bytes(buf, n) & t->vmask;
        while (t->vslot[h]) h = (h + 1) & t->vmask;
        t->vslot[h] = (uint32_t)id + 1;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        int64_t id = vocab_find(t, &c, 1);
        if (id < 0)
            die("%s: model.vocab lacks the ByteLevel token of byte 0x%02x (only byte-level BPE is supported)", t->file,
                b);
        t->byte_id[b] = (uint32_t)id;
    }
    size_t nm = json_array_size(merges);
    cap = 1;
    while (cap < 2 * nm + 2) cap *= 2;
    t->merges = xmalloc(cap * sizeof *t->merges), t->mmask = cap - 1;
    for (uint64_t k = 0; k < cap; k++) t->merges[k].key = UINT64_MAX;
    json_array_foreach(merges, i, val) {
        const char *a, *b;
        char pair[2048];
        if (json_is_string(val)) { // "a b"
            const char *s = json_string_value(val), *sp = strchr(s, ' ');
            if (!sp || strlen(s) >= sizeof pair) jdie(model, "merges", "merge %zu ('%s') is not 'a b'", i, s);
            memcpy(pair, s, strlen(s) + 1), pair[sp - s] = 0;
            a = pair, b = pair + (sp - s) + 1;
        } else if (json_is_array(val) && json_array_size(val) == 2 && json_is_string(json_array_get(val, 0)) &&
                   json_is_string(json_array_get(val, 1))) {
            a = json_string_value(json_array_get(val, 0)), b = json_string_value(json_array_get(val, 1));
        } else jdie(model, "merges", "merge %zu is neither 'a b' nor [a, b]", i);
        size_t na, nb;
        bytelevel_to_bytes(a, buf, &na);
        int64_t ia = vocab_find(t, buf, na);
        bytelevel_to_bytes(b, buf + na, &nb);
        int64_t ib = vocab_find(t, buf + na, nb), ic = vocab_find(t, buf, na + nb);
        if (ia < 0 || ib < 0 || ic < 0)
            jdie(model, "merges", "merge %zu ('%s' '%s') uses a token not in the vocabulary", i, a, b);
        uint64_t k = (uint64_t)ia << 32 | (uint64_t)ib, h = mix64(k) & t->mmask;
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != k) h = (h + 1) & t->mmask;
        if (t->merges[h].key == k) continue; // a repeated merge keeps its first rank
        t->merges[h] = (MergeSlot){k, (uint32_t)i, (uint32_t)ic};
    }
    free(buf);
}

// ---- components: added tokens, normalizer, pre-tokenizer, post-processor ---------------------------------------

static void load_added(Bpe *t, JObj root) {
    json_t *arr = json_object_get(root.obj, "added_tokens");
    if (arr && !json_is_array(arr)) jdie(root, "added_tokens", "expected an array");
    t->nadded = (int)json_array_size(arr);
    t->added = xcalloc(t->nadded + 1, sizeof *t->added);
    t->added_of_id = xmalloc(t->nids * sizeof *t->added_of_id);
    for (int64_t k = 0; k < t->nids; k++) t->added_of_id[k] = -1;
    for (int i = 0; i < t->nadded; i++) {
        JObj o = {json_array_get(arr, i), t->file, ""};
        snprintf(o.path, sizeof o.path, "added_tokens[%d]", i);
        if (!json_is_object(o.obj)) jdie(root, "added_tokens", "entry %d is not an object", i);
        Added *a = &t->added[i];
        a->content = xstrdup(jstr(o, "content", true, NULL));
        a->len = (uint32_t)strlen(a->content);
        a->id = (uint32_t)jint(o, "id", true, 0);
        a->lstrip = jbool(o, "lstrip", false, false), a->rstrip = jbool(o, "rstrip", false, false);
        a->single_word = jbool(o, "single_word", false, false), a->normalized = jbool(o, "normalized", false, false);
        if (!a->len) jdie(o, "content", "an added token must not be empty");
        t->added_of_id[a->id] = i;
    }
    for (int c = 0; c < 2; c++) {
        int n = 0;
        t->aorder[c] = xmalloc((t->nadded + 1) * sizeof(int));
        for (int b = 0; b < 256; b++) {
            t->abucket[c][b] = n;
            int first = n;
            for (int i = 0; i < t->nadded; i++)
                if (t->added[i].normalized == c && (uint8_t)t->added[i].content[0] == b) {
                    int j = n++; // insertion by length, longest first
                    while (j > first && t->added[t->aorder[c][j - 1]].len < t->added[i].len)
                        t->aorder[c][j] = t->aorder[c][j - 1], j--;
                    t->aorder[c][j] = i;
                }
        }
        t->abucket[c][256] = n;
        t->afirst[c] = -1;
        for (int b = 0; b < 256; b++)
            if (n > 0 && t->abucket[c][b + 1] - t->abucket[c][b] == n) t->afirst[c] = b;
    }
}

// A component of type "Sequence": loads each of its `items` with load; false for any other type.
static bool load_sequence(Bpe *t, json_t *c, JObj root, const char *type, const char *items,
                          void (*load)(Bpe *, json_t *, JObj)) {
    if (strcmp(type, "Sequence")) return false;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(c, items), i, x) load(t, x, root);
    return true;
}

static void load_normalizer(Bpe *t, json_t *n, JObj root) {
    if (!n || json_is_null(n)) return;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) jdie(root, "normalizer", "has no type");
    if (load_sequence(t, n, root, type, "normalizers", load_normalizer)) return;
    static const struct {
        const char *name;
        int opts;
    } forms[] = {
        {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
        {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
        {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
        {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
    };
    for (size_t k = 0; k < 4; k++)
        if (!strcmp(type, forms[k].name)) {
            if (t->nnorm == 4) jdie(root, "normalizer", "too many normalizers");
            t->norm[t->nnorm++] = forms[k].opts;
            if (k == 0) pthread_once(&nfc_once, nfc_tables);
            return;
        }
    jdie(root, "normalizer", "type '%s' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)", type);
}

// The characters below 128 that \p{name} holds (Unicode general categories and White_Space); false for other names.
static bool ascii_property(const char *name, size_t len, uint8_t mask[16]) {
    static const struct {
        const char *name;
        int lo, hi;
    } cats[] = {
        {"L", 1, 5},    {"L&", 1, 3},   {"Lu", 1, 1},   {"Ll", 2, 2},   {"Lt", 3, 3},   {"Lm", 4, 4},
        {"Lo", 5, 5},   {"M", 6, 8},    {"Mn", 6, 6},   {"Mc", 7, 7},   {"Me", 8, 8},   {"N", 9, 11},
        {"Nd", 9, 9},   {"Nl", 10, 10}, {"No", 11, 11}, {"P", 12, 18},  {"Pc", 12, 12}, {"Pd", 13, 13},
        {"Ps", 14, 14}, {"Pe", 15, 15}, {"Pi", 16, 16}, {"Pf", 17, 17}, {"Po", 18, 18}, {"S", 19, 22},
        {"Sm", 19, 19}, {"Sc", 20, 20}, {"Sk", 21, 21}, {"So", 22, 22}, {"Z", 23, 25},  {"Zs", 23, 23},
        {"Zl", 24, 24}, {"Zp", 25, 25}, {"C", 26, 29},  {"Cc", 26, 26}, {"Cf", 27, 27}, {"White_Space", -1, -1},
    };
    for (size_t k = 0; k < sizeof cats / sizeof *cats; k++) {
        if (strlen(cats[k].name) != len || memcmp(cats[k].name, name, len)) continue;
        memset(mask, 0, 16);
        for (int c = 0; c < 128; c++) {
            int cat = utf8proc_category(c);
            if (cats[k].lo < 0 ? is_white_space(c) : cat >= cats[k].lo && cat <= cats[k].hi)
                mask[c >> 3] |= (uint8_t)(1 << (c & 7));
        }
        return true;
    }
    return false;
}

// The pattern for text of ASCII characters only: each \p{X} / \P{X} becomes the ASCII characters it holds (as \xHH
// ranges, joining the class it is in or forming one), so it compiles without UTF/UCP, runs several times faster and
// matches ASCII text exactly as the Unicode pattern does. NULL if the pattern uses a property not known here.
static char *ascii_pattern(const char *p) {
    size_t n = strlen(p), o = 0;
    char *q = xmalloc(n * 600 + 16);
    bool in_class = false;
    for (size_t i = 0; i < n;) {
        if (p[i] == '\\' && (p[i + 1] == 'p' || p[i + 1] == 'P')) {
            bool neg = p[i + 1] == 'P';
            const char *name = p + i + 2, *end = name + 1;
            if (*name == '{') name++, end = strchr(name, '}');
            if (!end) return free(q), NULL;
            i = (size_t)(end - p) + (*end == '}');
            if (*name == '^') neg = !neg, name++;
            uint8_t mask[16];
            if (!ascii_property(name, (size_t)(end - name), mask)) return free(q), NULL;
            if (!in_class) q[o++] = '[';
            bool any = false;
            for (int c = 0; c < 128;) { // runs of members as ranges
                bool in = (mask[c >> 3] >> (c & 7) & 1) != neg;
                int e = c;
                if (in)
                    while (e + 1 < 128 && ((mask[(e + 1) >> 3] >> ((e + 1) & 7) & 1) != neg)) e++;
                if (in) o += (size_t)sprintf(q + o, "\\x%02x-\\x%02x", c, e), any = true;
                c = e + 1;
            }
            if (!any) o += (size_t)sprintf(q + o, "\\x80"); // empty: a byte no ASCII text has
            if (!in_class) q[o++] = ']';
            continue;
        }
        if (p[i] == '\\' && p[i + 1] == 'Q') return free(q), NULL; // quoting: not worth handling
        if (p[i] == '\\' && i + 1 < n) q[o++] = p[i++];
        else if (!in_class && p[i] == '[') {
            in_class = true, q[o++] = p[i++];
            if (p[i] == '^') q[o++] = p[i++];
            if (p[i] == ']') q[o++] = p[i++];
            continue;
        } else if (in_class && p[i] == '[' && p[i + 1] == ':') { // a POSIX class [:name:]
            const char *e = strstr(p + i, ":]");
            if (!e) return free(q), NULL;
            while (p + i < e) q[o++] = p[i++];
        } else if (in_class && p[i] == ']') in_class = false;
        q[o++] = p[i++];
    }
    q[o] = 0;
    return q;
}

// Compiles a regex of tokenizer.json. HF compiles it with Oniguruma, whose \s is Unicode White_Space; PCRE2's \s in
// UCP mode lacks U+0085, so \s and \S become \p{White_Space} and \P{White_Space} (valid inside classes too).
static void add_regex_step(Bpe *t, JObj root, const char *pat, bool literal, int behavior, bool invert) {
    if (t->nsteps == 8) jdie(root, "pre_tokenizer", "too many steps");
    size_t n = strlen(pat), o = 0;
    char *p = xmalloc(16 * n + 1);
    for (size_t i = 0; i < n; i++) {
        if (!literal && pat[i] == '\\' && i + 1 < n) {
            if (pat[i + 1] == 's' || pat[i + 1] == 'S') {
                o += (size_t)sprintf(p + o, "\\%c{White_Space}", pat[i + 1] == 's' ? 'p' : 'P'), i++;
                continue;
            }
            p[o++] = pat[i++];
        }
        p[o++] = pat[i];
    }
    p[o] = 0;
    int err;
    PCRE2_SIZE at;
    // no start optimisation: matches start where the previous one ended, so searching ahead only costs
    uint32_t opts =
        PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | PCRE2_NO_START_OPTIMIZE | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, o, opts, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        jdie(root, "pre_tokenizer", "regex /%s/ does not compile: %s (at offset %zu)", pat, (char *)msg, (size_t)at);
    }
    PreStep *st = &t->steps[t->nsteps++];
    *st = (PreStep){
        .re = re, .jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0, .behavior = behavior, .invert = invert};
    char *a = literal ? NULL : ascii_pattern(p);
    if (a) st->ascii = pcre2_compile((PCRE2_SPTR)a, PCRE2_ZERO_TERMINATED, PCRE2_NO_START_OPTIMIZE, &err, &at, NULL);
    if (st->ascii) st->ascii_jit = pcre2_jit_compile(st->ascii, PCRE2_JIT_COMPLETE) == 0;
    free(a), free(p);
}

static void load_pre_tokenizer(Bpe *t, json_t *p, JObj root) {
    if (!p || json_is_null(p)) return;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) jdie(root, "pre_tokenizer", "has no type");
    if (load_sequence(t, p, root, type, "pretokenizers", load_pre_tokenizer)) return;
    if (!strcmp(type, "Split")) {
        static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        int b = -1;
        for (int k = 0; k < 5; k++)
            if (beh && !strcmp(beh, names[k])) b = k;
        if (b < 0) jdie(root, "pre_tokenizer", "Split behavior '%s' is not supported", beh ? beh : "(none)");
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex")),
                   *lit = json_string_value(json_object_get(pat, "String"));
        if (!re && !lit) jdie(root, "pre_tokenizer", "Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
        add_regex_step(t, root, re ? re : lit, !re, b, json_is_true(json_object_get(p, "invert")));
    } else if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            jdie(root, "pre_tokenizer", "ByteLevel with add_prefix_space=true is not supported");
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) // GPT-2's pattern
            add_regex_step(t, root,
                           "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", false,
                           SPLIT_ISOLATED, false);
        t->bytelevel = true;
    } else jdie(root, "pre_tokenizer", "type '%s' is not supported (supported: Split, ByteLevel, Sequence)", type);
}

// The "single" template of a TemplateProcessing post-processor (possibly inside a Sequence): specials around $A.
static void load_template(Bpe *t, json_t *p, JObj root) {
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type || load_sequence(t, p, root, type, "processors", load_template) || strcmp(type, "TemplateProcessing"))
        return;
    size_t i;
    json_t *x;
    bool after = false;
    json_array_foreach(json_object_get(p, "single"), i, x) {
        json_t *sp = json_object_get(x, "SpecialToken");
        if (!sp) {
            after = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        json_t *ids = json_object_get(json_object_get(json_object_get(p, "special_tokens"), name ? name : ""), "ids");
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            if (t->nprefix == 8 || t->nsuffix == 8) jdie(root, "post_processor", "too many special tokens");
            if (after) t->suffix[t->nsuffix++] = (uint32_t)json_integer_value(id);
            else t->prefix[t->nprefix++] = (uint32_t)json_integer_value(id);
        }
    }
}

// tokenizer_config.json's key (a token string or {"content": ...}), a token of this vocabulary; NULL if absent.
static char *config_token(const Bpe *t, JObj cfg, const char *key) {
    json_t *v = json_object_get(cfg.obj, key), *content = json_object_get(v, "content");
    const char *tok = json_is_string(v) ? json_string_value(v) : json_string_value(content); // NULL if not a string
    if (!tok && v && !json_is_null(v)) jdie(cfg, key, "expected a token string or {\"content\": ...}");
    if (tok && bpe_token_to_id(t, tok) < 0) jdie(cfg, key, "'%s' is not in the vocabulary of %s", tok, t->file);
    return tok ? xstrdup(tok) : NULL;
}

Bpe *bpe_load(const char *path) {
    static bool tables;
    if (!tables) bytelevel_tables(), tables = true;
    Bpe *t = xcalloc(1, sizeof *t);
    path_in_folder(t->file, sizeof t->file, path, "tokenizer.json");
    if (!path_exists(t->file)) die("%s: no such tokenizer file", t->file);
    json_t *doc = json_load_or_die(t->file);
    JObj root = jobj_root(doc, t->file), model = jobj_child(root, "model");
    if (!model.obj) jdie(root, "model", "missing");
    const char *mtype = jstr(model, "type", false, "BPE");
    if (strcmp(mtype, "BPE")) jdie(model, "type", "model type '%s' is not supported (only BPE)", mtype);
    if (json_is_true(json_object_get(model.obj, "byte_fallback"))) jdie(model, "byte_fallback", "is not supported");
    if (jhas(model, "dropout") && jnum(model, "dropout", false, 0) != 0) jdie(model, "dropout", "is not supported");
    if (strlen(jstr(model, "continuing_subword_prefix", false, "")) ||
        strlen(jstr(model, "end_of_word_suffix", false, "")))
        jdie(model, "continuing_subword_prefix", "subword prefixes/suffixes are not supported");
    t->ignore_merges = jbool(model, "ignore_merges", false, false);
    load_vocab_and_merges(t, model, json_object_get(root.obj, "added_tokens"));
    load_added(t, root);
    load_normalizer(t, json_object_get(root.obj, "normalizer"), root);
    load_pre_tokenizer(t, json_object_get(root.obj, "pre_tokenizer"), root);
    if (!t->bytelevel) jdie(root, "pre_tokenizer", "has no ByteLevel step (only byte-level BPE is supported)");
    json_t *post = json_object_get(root.obj, "post_processor");
    if (post && !json_is_null(post)) load_template(t, post, root);

    char cfgfile[4200], dir[4096];
    path_dirname(dir, sizeof dir, t->file);
    path_join(cfgfile, sizeof cfgfile, dir, "tokenizer_config.json");
    if (path_exists(cfgfile)) {
        json_error_t e; // INT_AS_REAL: model_max_length may be 1e30 written as an integer
        json_t *cdoc = json_read_file(cfgfile, JSON_DECODE_INT_AS_REAL, &e);
        if (!cdoc) die("%s:%d:%d: invalid JSON: %s", cfgfile, e.line, e.column, e.text);
        JObj cfg = jobj_root(cdoc, cfgfile);
        t->bos = config_token(t, cfg, "bos_token"), t->eos = config_token(t, cfg, "eos_token");
        // transformers rebuilds the template from these flags when the config sets them (LlamaTokenizerFast et al.)
        if (jhas(cfg, "add_bos_token") || jhas(cfg, "add_eos_token")) {
            t->nprefix = t->nsuffix = 0;
            if (jbool(cfg, "add_bos_token", false, false)) {
                if (!t->bos) jdie(cfg, "add_bos_token", "is true but there is no bos_token");
                t->prefix[t->nprefix++] = (uint32_t)bpe_token_to_id(t, t->bos);
            }
            if (jbool(cfg, "add_eos_token", false, false)) {
                if (!t->eos) jdie(cfg, "add_eos_token", "is true but there is no eos_token");
                t->suffix[t->nsuffix++] = (uint32_t)bpe_token_to_id(t, t->eos);
            }
        }
        json_decref(cdoc);
    }
    json_decref(doc);
    return t;
}

void bpe_free(Bpe *t) {
    if (!t) return;
    for (int i = 0; i < t->nsteps; i++) pcre2_code_free(t->steps[i].re), pcre2_code_free(t->steps[i].ascii);
    for (int i = 0; i < t->nadded; i++) free(t->added[i].content);
    free(t->added), free(t->added_of_id), free(t->aorder[0]), free(t->aorder[1]);
    free(t->blob), free(t->off), free(t->len), free(t->vslot), free(t->merges);
    free(t->bos), free(t->eos), free(t);
}

int64_t bpe_token_to_id(const Bpe *t, const char *token) {
    for (int i = 0; i < t->nadded; i++)
        if (!strcmp(t->added[i].content, token)) return t->added[i].id;
    size_t n = strlen(token);
    uint8_t *buf = xmalloc(n + 1);
    int64_t id = bytelevel_to_bytes(token, buf, &n) ? vocab_find(t, buf, n) : -1;
    free(buf);
    return id;
}

int64_t bpe_num_ids(const Bpe *t) { return t->nids; }
bool bpe_has_normalizer(const Bpe *t) { return t->nnorm > 0; }

const char *bpe_config_token(const Bpe *t, const char *key) {
    return !strcmp(key, "eos_token") ? t->eos : !strcmp(key, "bos_token") ? t->bos : NULL;
}

// ---- per-thread state ---------------------------------------------------------------------------------------------

// Per-thread word cache: open addressing over 32-byte slots. A word of up to 12 bytes with up to 3 ids lives in its
// slot; a longer one (up to CACHE_MAX_WORD bytes) keeps its bytes and ids in cmem. When full it is emptied.
#define CACHE_SLOTS (1 << 16)
#define CACHE_MAX_WORD 64
typedef struct {
    uint32_t h; // hash tag, 0 = empty
    uint8_t klen, nids;
    union {
        struct {
            uint8_t key[12];
            uint32_t ids[3];
        } in;        // klen <= 12 && nids <= 3
        uint32_t at; // otherwise: bytes, then ids at the next multiple of 4, at cmem + at
    };
} CacheSlot;

typedef struct {
    size_t off, len;
} Span;

// A candidate merge of the symbols at pos and q (whose right neighbour was after, -1 if none) into new_id. Symbol
// boundaries only ever disappear, so the entry is still current iff pos is alive, next[pos] == q, next[q] == after.
typedef struct {
    uint32_t rank, pos, new_id;
    int32_t q, after;
} HeapItem;

struct BpeScratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    Span *spans[2];
    size_t span_cap[2];
    uint32_t *sym, *rank, *nid;
    int32_t *prev, *next;
    HeapItem *heap;
    size_t word_cap;
    CacheSlot *cache;
    uint8_t *cmem;
    size_t cused, ccount;
};

#define CACHE_MEM (4u << 20)

// Makes the per-word arrays hold words of n bytes.
static void word_reserve(BpeScratch *s, size_t n) {
    if (n <= s->word_cap) return;
    size_t c = s->word_cap = n + n / 2;
    s->sym = xrealloc(s->sym, c * 4), s->rank = xrealloc(s->rank, c * 4), s->nid = xrealloc(s->nid, c * 4);
    s->prev = xrealloc(s->prev, c * 4), s->next = xrealloc(s->next, c * 4),
    s->heap = xrealloc(s->heap, 2 * c * sizeof(HeapItem));
}

BpeScratch *bpe_scratch_new(const Bpe *t) {
    BpeScratch *s = xcalloc(1, sizeof *s);
    s->md = pcre2_match_data_create(1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    CHECK(s->md && s->mctx && s->jit_stack);
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
    s->cache = xcalloc(CACHE_SLOTS, sizeof *s->cache);
    s->cmem = xmalloc(CACHE_MEM);
    word_reserve(s, 256);
    return s;
}

void bpe_scratch_free(BpeScratch *s) {
    if (!s) return;
    pcre2_match_data_free(s->md), pcre2_match_context_free(s->mctx), pcre2_jit_stack_free(s->jit_stack);
    free(s->spans[0]), free(s->spans[1]), free(s->sym), free(s->rank), free(s->nid), free(s->prev), free(s->next);
    free(s->heap), free(s->cache), free(s->cmem), free(s);
}

static inline void span_push(BpeScratch *s, int k, size_t *n, size_t off, size_t len) {
    if (*n == s->span_cap[k]) {
        s->span_cap[k] = s->span_cap[k] ? 2 * s->span_cap[k] : 1024;
        s->spans[k] = xrealloc(s->spans[k], s->span_cap[k] * sizeof(Span));
    }
    s->spans[k][(*n)++] = (Span){off, len};
}

// ---- BPE on one word ----------------------------------------------------------------------------------------------

static void heap_push(HeapItem *h, size_t *n, HeapItem x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < x.rank || (h[p].rank == x.rank && h[p].pos < x.pos)) break;
        h[i] = h[p], i = p;
    }
    h[i] = x;
}

static HeapItem heap_pop(HeapItem *h, size_t *n) {
    HeapItem top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos))) c++;
        if (x.rank < h[c].rank || (x.rank == h[c].rank && x.pos < h[c].pos)) break;
        h[i] = h[c], i = c;
    }
    h[i] = x;
    return top;
}

// Merges the bytes w[0..n) into symbols; writes the resulting ids to s->sym[0..return).
static size_t bpe_merge(const Bpe *t, BpeScratch *s, const uint8_t *w, size_t n) {
    if (n >= INT32_MAX) die("tokenizer: a single pre-tokenized word of %zu bytes is too long (limit 2 GB)", n);
    word_reserve(s, n);
    uint32_t *sym = s->sym, *rank = s->rank, *nid = s->nid;
    for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[w[i]];
    if (n < bpe_heap_min_len) { // linear scan over the pair ranks, updated around each merge
        size_t m = n;
        for (size_t i = 0; i + 1 < m; i++)
            if (!merge_get(t, sym[i], sym[i + 1], &rank[i], &nid[i])) rank[i] = UINT32_MAX;
        while (m > 1) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < m; i++)
                if (rank[i] < rank[best]) best = i;
            if (rank[best] == UINT32_MAX) break;
            sym[best] = nid[best];
            m--;
            memmove(sym + best + 1, sym + best + 2, (m - best - 1) * 4);
            memmove(rank + best + 1, rank + best + 2, (m - best - 1) * 4);
            memmove(nid + best + 1, nid + best + 2, (m - best - 1) * 4);
            if (best > 0 && !merge_get(t, sym[best - 1], sym[best], &rank[best - 1], &nid[best - 1]))
                rank[best - 1] = UINT32_MAX;
            if (best + 1 < m && !merge_get(t, sym[best], sym[best + 1], &rank[best], &nid[best]))
                rank[best] = UINT32_MAX;
        }
        return m;
    }
    // heap of (rank, left position) over a doubly linked list (≤ 2n entries: each merge adds at most one net);
    // stale entries are recognised and dropped on pop
    int32_t *prev = s->prev, *next = s->next;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) prev[i] = (int32_t)i - 1, next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    uint32_t r, id;
    for (size_t i = 0; i + 1 < n; i++)
        if (merge_get(t, sym[i], sym[i + 1], &r, &id))
            heap_push(s->heap, &nh, (HeapItem){r, (uint32_t)i, id, (int32_t)i + 1, next[i + 1]});
    while (nh) {
        HeapItem top = heap_pop(s->heap, &nh);
        uint32_t p = top.pos;
        int32_t q = top.q;
        if (sym[p] == UINT32_MAX || next[p] != q || next[q] != top.after) continue;
        sym[p] = top.new_id, sym[q] = UINT32_MAX;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = (int32_t)p;
        int32_t a = prev[p], b = next[p];
        if (a >= 0 && merge_get(t, sym[a], sym[p], &r, &id))
            heap_push(s->heap, &nh, (HeapItem){r, (uint32_t)a, id, (int32_t)p, b});
        if (b >= 0 && merge_get(t, sym[p], sym[b], &r, &id)) heap_push(s->heap, &nh, (HeapItem){r, p, id, b, next[b]});
    }
    size_t m = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) sym[m++] = sym[i];
    return m;
}

static inline void ids_put(IdVec *v, const uint32_t *ids, size_t k) {
    if (v->n + k > v->cap) v->cap = 2 * (v->n + k) + 256, v->p = xrealloc(v->p, v->cap * sizeof *v->p);
    memcpy(v->p + v->n, ids, 4 * k), v->n += k;
}

static void bpe_word(const Bpe *t, BpeScratch *s, const uint8_t *w, size_t n, IdVec *out) {
    if (n == 1) return ids_put(out, &t->byte_id[w[0]], 1);
    uint64_t h = 0, slot = 0;
    if (n <= CACHE_MAX_WORD) {
        uint64_t hh = hash_bytes(w, n);
        h = (uint32_t)(hh >> 32) | 1;
        for (slot = hh & (CACHE_SLOTS - 1);; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            CacheSlot *c = &s->cache[slot];
            if (!c->h) break;
            if (c->h != h || c->klen != n) continue;
            if (n <= 12 && c->nids <= 3) {
                if (!memcmp(c->in.key, w, n)) return ids_put(out, c->in.ids, c->nids);
            } else if (!memcmp(s->cmem + c->at, w, n))
                return ids_put(out, (uint32_t *)(s->cmem + c->at + ((n + 3) & ~(size_t)3)), c->nids);
        }
    }
    int64_t id = t->ignore_merges ? vocab_find(t, w, n) : -1; // a word in the vocabulary is one token
    size_t m = id >= 0 ? (s->sym[0] = (uint32_t)id, 1) : bpe_merge(t, s, w, n);
    ids_put(out, s->sym, m);
    if (!h) return;
    bool inl = n <= 12 && m <= 3;
    size_t need = inl ? 0 : ((n + 3) & ~(size_t)3) + 4 * m;
    if (s->ccount >= CACHE_SLOTS / 2 || s->cused + need > CACHE_MEM) { // full: start over (results do not change)
        memset(s->cache, 0, CACHE_SLOTS * sizeof *s->cache);
        s->cused = s->ccount = 0;
        for (slot = hash_bytes(w, n) & (CACHE_SLOTS - 1); s->cache[slot].h; slot = (slot + 1) & (CACHE_SLOTS - 1)) {}
    }
    CacheSlot *c = &s->cache[slot];
    c->h = (uint32_t)h, c->klen = (uint8_t)n, c->nids = (uint8_t)m, s->ccount++;
    if (inl) memcpy(c->in.key, w, n), memcpy(c->in.ids, s->sym, 4 * m);
    else {
        c->at = (uint32_t)s->cused;
        memcpy(s->cmem + s->cused, w, n), memcpy(s->cmem + s->cused + ((n + 3) & ~(size_t)3), s->sym, 4 * m);
        s->cused += need;
    }
}

// ---- pre-tokenization ---------------------------------------------------------------------------------------------

// Runs one step over the spans in list `from`, writing the list `1 - from`; returns its length.
static size_t pre_step(const PreStep *st, BpeScratch *s, const uint8_t *txt, int from, size_t nin) {
    size_t nout = 0;
    int to = 1 - from;
    for (size_t k = 0; k < nin; k++) {
        Span sp = s->spans[from][k];
        const uint8_t *subj = txt + sp.off;
        bool ascii = st->ascii && bpe_ascii_regex && ascii_prefix(subj, sp.len) == sp.len;
        size_t pos = 0, last = 0, first = nout;
        bool prev_match = false, pending = false;
        size_t pend_off = 0;
        for (;;) {
            size_t ms = sp.len, me = sp.len;
            if (pos < sp.len) {
                int rc = ascii && st->ascii_jit ? pcre2_jit_match(st->ascii, subj, sp.len, pos, 0, s->md, s->mctx)
                         : ascii                ? pcre2_match(st->ascii, subj, sp.len, pos, 0, s->md, s->mctx)
                         : st->jit              ? pcre2_jit_match(st->re, subj, sp.len, pos, 0, s->md, s->mctx)
                                   : pcre2_match(st->re, subj, sp.len, pos, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
                if (rc >= 0) {
                    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
                    ms = ov[0], me = ov[1];
                    if (me == ms) { // empty match: not a piece; move on by one character
                        int32_t cp;
                        pos = ms + (ms < sp.len ? (size_t)utf8_decode(subj + ms, &cp) : 1);
                        if (pos < sp.len) continue;
                        ms = me = sp.len;
                    }
                } else if (rc != PCRE2_ERROR_NOMATCH)
                    die("tokenizer: regex matching failed (PCRE2 error %d) on a piece of %zu bytes", rc, sp.len);
            }
            // the gap [last, ms) then the match [ms, me); with invert their roles swap
            for (int part = 0; part < 2; part++) {
                size_t a = part ? ms : last, b = part ? me : ms;
                if (a == b) continue;
                bool is_match = (part == 1) != st->invert;
                switch (st->behavior) {
                case SPLIT_ISOLATED: span_push(s, to, &nout, sp.off + a, b - a); break;
                case SPLIT_REMOVED:
                    if (!is_match) span_push(s, to, &nout, sp.off + a, b - a);
                    break;
                case SPLIT_MERGED_PREV: // MergedWithPrevious: a match joins the gap before it; Contiguous: adjacent matches are one piece
                case SPLIT_CONTIGUOUS:
                    if (is_match && prev_match == (st->behavior == SPLIT_CONTIGUOUS) && nout > first)
                        s->spans[to][nout - 1].len = sp.off + b - s->spans[to][nout - 1].off;
                    else span_push(s, to, &nout, sp.off + a, b - a);
                    break;
                case SPLIT_MERGED_NEXT: // a match joins the gap after it
                    if (is_match) {
                        if (pending) span_push(s, to, &nout, pend_off, sp.off + a - pend_off);
                        pending = true, pend_off = sp.off + a;
                    } else {
                        size_t start = pending ? pend_off : sp.off + a;
                        span_push(s, to, &nout, start, sp.off + b - start);
                        pending = false;
                    }
                    break;
                }
                prev_match = is_match;
            }
            if (me >= sp.len) break;
            last = pos = me;
        }
        if (pending) span_push(s, to, &nout, pend_off, sp.off + sp.len - pend_off);
    }
    return nout;
}

// Pre-tokenizes and encodes normalized text that holds no added token.
static void encode_piece(const Bpe *t, BpeScratch *s, const uint8_t *txt, size_t n, IdVec *out) {
    if (!n) return;
    size_t cnt = 0;
    int cur = 0;
    span_push(s, 0, &cnt, 0, n);
    for (int k = 0; k < t->nsteps; k++) cnt = pre_step(&t->steps[k], s, txt, cur, cnt), cur = 1 - cur;
    for (size_t i = 0; i < cnt; i++) bpe_word(t, s, txt + s->spans[cur][i].off, s->spans[cur][i].len, out);
}

static bool is_word_char(const uint8_t *s, size_t n, size_t at, bool before) {
    if (before) { // the character ending at s[at)
        if (at == 0) return false;
        while (at > 0 && (s[at - 1] & 0xC0) == 0x80) at--;
        at--;
    } else if (at >= n) return false;
    int32_t cp;
    utf8_decode(s + at, &cp);
    utf8proc_category_t c = utf8proc_category(cp);
    return cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

// Finds the leftmost-longest added token of class c in s[from..n); *ms..*me is the span it takes (with lstrip/rstrip).
static bool find_added(const Bpe *t, int c, const uint8_t *s, size_t n, size_t from, size_t *ms, size_t *me,
                       uint32_t *id) {
    const int *bk = t->abucket[c];
    if (bk[256] == 0) return false;
    for (size_t i = from; i < n; i++) {
        if (t->afirst[c] >= 0) { // one first byte for all: jump to it
            const uint8_t *q = memchr(s + i, t->afirst[c], n - i);
            if (!q) return false;
            i = (size_t)(q - s);
        }
        for (int k = bk[s[i]]; k < bk[s[i] + 1]; k++) {
            const Added *a = &t->added[t->aorder[c][k]];
            if (a->len > n - i || memcmp(s + i, a->content, a->len)) continue;
            if (a->single_word && (is_word_char(s, n, i, true) || is_word_char(s, n, i + a->len, false))) continue;
            size_t b = i, e = i + a->len;
            int32_t cp;
            while (a->lstrip && b > from) { // back over one whitespace character
                size_t p = b - 1;
                while (p > from && (s[p] & 0xC0) == 0x80) p--;
                utf8_decode(s + p, &cp);
                if (!is_white_space(cp)) break;
                b = p;
            }
            while (a->rstrip && e < n && (utf8_decode(s + e, &cp), is_white_space(cp)))
                e += (size_t)utf8_decode(s + e, &cp);
            *ms = b, *me = e, *id = a->id;
            return true;
        }
    }
    return false;
}

static uint8_t *normalize(const Bpe *t, const uint8_t *s, size_t n, size_t *out_n) {
    uint8_t *cur = NULL;
    for (int k = 0; k < t->nnorm; k++) {
        bool quick = true; // NFC: the quick check; the other forms leave only ASCII alone for sure
        if (t->norm[k] == (UTF8PROC_STABLE | UTF8PROC_COMPOSE)) quick = nfc_quick(s, n);
        else quick = ascii_prefix(s, n) == n;
        if (quick) continue;
        uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, t->norm[k]);
        CHECK(r >= 0); // the text is valid UTF-8 here
        free(cur);
        cur = dst, s = dst, n = (size_t)r;
    }
    *out_n = n;
    return cur; // NULL: unchanged
}

char *bpe_normalize(const Bpe *t, const char *text, size_t len, size_t *out_len) {
    uint8_t *r = normalize(t, (const uint8_t *)text, len, out_len);
    if (r) return (char *)r;
    char *c = xmalloc(len + 1);
    memcpy(c, text, len), c[len] = 0;
    return c;
}

// Encodes txt[0..n) split at the added tokens of class c, each one id. Between them, class 0's text is normalized
// and split at class 1's; class 1's is pre-tokenized and encoded.
static void encode_split(const Bpe *t, BpeScratch *s, int c, const uint8_t *txt, size_t n, IdVec *out) {
    size_t pos = 0, ms, me, nn;
    uint32_t id;
    for (;;) {
        bool hit = find_added(t, c, txt, n, pos, &ms, &me, &id);
        size_t end = hit ? ms : n;
        if (c == 1) encode_piece(t, s, txt + pos, end - pos, out);
        else if (end > pos) {
            uint8_t *norm = normalize(t, txt + pos, end - pos, &nn);
            encode_split(t, s, 1, norm ? norm : txt + pos, nn, out);
            free(norm);
        }
        if (!hit) return;
        idvec_push(out, id);
        pos = me;
    }
}

void bpe_encode(const Bpe *t, BpeScratch *s, const char *text, size_t len, bool add_special, IdVec *out) {
    if (add_special)
        for (int i = 0; i < t->nprefix; i++) idvec_push(out, t->prefix[i]);
    size_t n = len;
    char *fixed = bpe_utf8_repair(text, len, &n);
    encode_split(t, s, 0, (const uint8_t *)(fixed ? fixed : text), n, out);
    free(fixed);
    if (add_special)
        for (int i = 0; i < t->nsuffix; i++) idvec_push(out, t->suffix[i]);
}

char *bpe_decode(const Bpe *t, const uint32_t *ids, size_t n, size_t *len) {
    size_t cap = 64, o = 0;
    char *out = xmalloc(cap);
    for (size_t i = 0; i < n; i++) {
        CHECK(ids[i] < t->nids);
        int32_t a = t->added_of_id[ids[i]];
        const void *src = a >= 0 ? (const void *)t->added[a].content : (const void *)(t->blob + t->off[ids[i]]);
        size_t k = a >= 0 ? t->added[a].len : t->len[ids[i]] == UINT32_MAX ? 0 : t->len[ids[i]];
        if (o + k + 1 > cap) cap = 2 * (o + k + 1), out = xrealloc(out, cap);
        memcpy(out + o, src, k), o += k;
    }
    out[o] = 0;
    *len = o;
    return out;
}

// npy.c — reading and writing 1-D .npy records (format version 1.0/2.0/3.0, little-endian only).
// Layout: "\x93NUMPY", major, minor, header length (uint16 for v1, uint32 for v2/3), an ASCII dict
// {'descr': '<u4', 'fortran_order': False, 'shape': (N,), } padded with spaces to a multiple of 64 and
// ending in '\n', then the raw data.
#include "base/npy.h"

#include <ctype.h>
#include <errno.h>

static const struct {
    const char *descr;
    DType dt;
} npy_types[] = {
    {"<u4", DT_U32}, {"<u2", DT_U16}, {"|u1", DT_U8},  {"<u8", DT_U64}, {"<i4", DT_I32},
    {"<i8", DT_I64}, {"<f4", DT_F32}, {"<f8", DT_F64}, {"<f2", DT_F16},
};

// Finds the value text after 'key': inside the header dict.
static const char *dict_value(const char *hdr, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s':", key);
    const char *p = strstr(hdr, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    return p;
}

bool npy_parse(const uint8_t *buf, size_t len, NpyRecord *rec, char *err, size_t cap) {
    if (len < 10) return fail(err, cap, "truncated .npy record (shorter than its preamble)");
    if (memcmp(buf, "\x93NUMPY", 6) != 0) return fail(err, cap, "not a .npy record (bad magic)");
    int major = buf[6];
    size_t hlen, pre;
    if (major == 1) hlen = buf[8] | (size_t)buf[9] << 8, pre = 10;
    else if (major == 2 || major == 3) {
        if (len < 12) return fail(err, cap, "truncated .npy record preamble");
        hlen = buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24, pre = 12;
    } else return fail(err, cap, "unsupported .npy format version");
    if (hlen > 1 << 20 || pre + hlen > len) return fail(err, cap, "truncated .npy header");
    char hdr[4096];
    if (hlen >= sizeof hdr) return fail(err, cap, ".npy header too long");
    memcpy(hdr, buf + pre, hlen);
    hdr[hlen] = 0;
    const char *d = dict_value(hdr, "descr"), *fo = dict_value(hdr, "fortran_order"), *sh = dict_value(hdr, "shape");
    if (!d || !fo || !sh) return fail(err, cap, ".npy header lacks descr, fortran_order or shape");
    bool found = false;
    for (size_t i = 0; i < sizeof npy_types / sizeof *npy_types; i++) {
        size_t dl = strlen(npy_types[i].descr);
        if (d[0] == '\'' && strncmp(d + 1, npy_types[i].descr, dl) == 0 && d[1 + dl] == '\'')
            rec->dt = npy_types[i].dt, found = true;
    }
    if (!found) return fail(err, cap, "unsupported .npy dtype (expected a little-endian integer or float)");
    if (strncmp(fo, "False", 5) != 0) return fail(err, cap, ".npy fortran_order must be False");
    if (*sh != '(') return fail(err, cap, "malformed .npy shape");
    char *end;
    errno = 0;
    long long n = strtoll(sh + 1, &end, 10);
    bool overflow = errno == ERANGE;
    while (*end == ' ') end++;
    if (end == sh + 1 || n < 0 || *end != ',') return fail(err, cap, "expected a 1-D .npy array");
    if (overflow) return fail(err, cap, ".npy shape does not fit in 64 bits");
    end++;
    while (*end == ' ') end++;
    if (*end != ')') return fail(err, cap, "expected a 1-D .npy array");
    // n · elem ≤ len − (pre + hlen), asked without forming a product that can overflow
    size_t elem = dtype_size(rec->dt), room = len - pre - hlen;
    if ((unsigned long long)n > room / elem)
        return fail(err, cap, "truncated .npy data (file shorter than its header says)");
    size_t bytes = (size_t)n * elem;
    rec->n = n;
    rec->data = buf + pre + hlen;
    rec->record_len = pre + hlen + bytes;
    return true;
}

bool npy_token_file_parse(const uint8_t *buf, size_t len, NpyRecord *tok, NpyRecord *ends, NpyRecord *mask, char *err,
                          size_t cap) {
    char why[200];
    *mask = (NpyRecord){0};
    if (!npy_parse(buf, len, tok, why, sizeof why)) return fail(err, cap, "token record: %s", why);
    if (tok->dt != DT_U8 && tok->dt != DT_U16 && tok->dt != DT_U32 && tok->dt != DT_U64)
        return fail(err, cap, "token record: dtype %s, expected an unsigned integer type", dtype_name(tok->dt));
    if (!npy_parse(buf + tok->record_len, len - tok->record_len, ends, why, sizeof why))
        return fail(err, cap, "document-end record: %s", why);
    if (ends->dt != DT_U64)
        return fail(err, cap, "document-end record: dtype %s, expected uint64", dtype_name(ends->dt));
    size_t at = tok->record_len + ends->record_len;
    if (at < len) { // format 2: the loss mask
        if (!npy_parse(buf + at, len - at, mask, why, sizeof why))
            return fail(err, cap, "%zu bytes after the document-end record, not a loss-mask record: %s", len - at, why);
        if (mask->dt != DT_U8 || mask->n != tok->n)
            return fail(err, cap, "loss-mask record: %lld values of dtype %s, expected %lld uint8 (one per token)",
                        (long long)mask->n, dtype_name(mask->dt), (long long)tok->n);
        if (at + mask->record_len != len)
            return fail(err, cap, "%zu bytes after the loss-mask record (a token file is two or three .npy records)",
                        len - at - mask->record_len);
        const uint8_t *v = mask->data, *bad = NULL;
        for (int64_t i = 0; !bad && i < mask->n; i++) bad = v[i] > 1 ? v + i : NULL;
        if (bad)
            return fail(err, cap, "loss-mask record: value %u at token %lld (0: not a target, 1: a target)", *bad,
                        (long long)(bad - v));
    }
    // Ends rise strictly to the token count. The record follows the tokens, so it need not be 8-byte
    // aligned: read through memcpy.
    uint64_t prev = 0, e = 0;
    for (int64_t i = 0; i < ends->n; i++) {
        memcpy(&e, (const uint8_t *)ends->data + 8 * i, sizeof e);
        if (e <= prev && (i > 0 || e == 0))
            return fail(err, cap, "document-end record: end %lld is %llu, not above the one before (%llu)",
                        (long long)i, (unsigned long long)e, (unsigned long long)prev);
        prev = e;
    }
    if (ends->n && e != (uint64_t)tok->n)
        return fail(err, cap, "document-end record: last end is %llu but the file has %lld tokens",
                    (unsigned long long)e, (long long)tok->n);
    return true;
}

// shape: "(n,)" or "(rows, cols)".
static bool write_header(FILE *f, DType dt, const char *shape) {
    const char *descr = NULL;
    for (size_t i = 0; i < sizeof npy_types / sizeof *npy_types; i++)
        if (npy_types[i].dt == dt) descr = npy_types[i].descr;
    CHECK(descr);
    char hdr[256];
    int len =
        snprintf(hdr + 10, sizeof hdr - 10, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    int total = (10 + len + 1 + 63) / 64 * 64; // preamble + dict + '\n', padded to 64
    CHECK(total <= (int)sizeof hdr);
    unsigned hlen = (unsigned)(total - 10);
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = (char)(hlen & 0xff), hdr[9] = (char)(hlen >> 8);
    memset(hdr + 10 + len, ' ', total - 10 - len - 1);
    hdr[total - 1] = '\n';
    return fwrite(hdr, 1, total, f) == (size_t)total;
}

bool npy_write_header(FILE *f, DType dt, int64_t n) {
    char shape[32];
    snprintf(shape, sizeof shape, "(%lld,)", (long long)n);
    return write_header(f, dt, shape);
}

bool npy_write_header_2d(FILE *f, DType dt, int64_t rows, int64_t cols) {
    char shape[48];
    snprintf(shape, sizeof shape, "(%lld, %lld)", (long long)rows, (long long)cols);
    return write_header(f, dt, shape);
}

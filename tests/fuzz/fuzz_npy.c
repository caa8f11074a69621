// fuzz_npy.c — libFuzzer target: arbitrary bytes parsed as a token file (two or three .npy records, npy_token_file_parse)
// and as one .npy record. Either the parse fails with a one-line reason, or every record lies inside the input, its
// element count times its element size is its data, and the token file's records fill the input exactly with
// document ends rising to the token count and a loss mask, if any, of one 0 or 1 per token. ASan/UBSan catch out-of-bounds reads and undefined behaviour.
#include "base/npy.h"

static void check_record(const NpyRecord *r, const uint8_t *buf, size_t len) {
    CHECK(r->n >= 0 && r->record_len <= len);
    const uint8_t *p = r->data;
    CHECK(p >= buf && p + (size_t)r->n * dtype_size(r->dt) == buf + r->record_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    NpyRecord one, tok, ends, mask;
    char err[300];
    if (npy_parse(data, size, &one, err, sizeof err)) check_record(&one, data, size);
    else CHECK(err[0] && !strchr(err, '\n'));
    if (!npy_token_file_parse(data, size, &tok, &ends, &mask, err, sizeof err)) {
        bool named = !strncmp(err, "token record: ", 14) || !strncmp(err, "document-end record: ", 21) ||
                     !strncmp(err, "loss-mask record: ", 18) || strstr(err, "bytes after");
        CHECK(named && !strchr(err, '\n'));
        return 0;
    }
    check_record(&tok, data, size);
    check_record(&ends, data + tok.record_len, size - tok.record_len);
    size_t at = tok.record_len + ends.record_len;
    if (mask.data) {
        check_record(&mask, data + at, size - at);
        CHECK(mask.dt == DT_U8 && mask.n == tok.n);
        for (int64_t i = 0; i < mask.n; i++) CHECK(((const uint8_t *)mask.data)[i] <= 1);
        at += mask.record_len;
    }
    CHECK(at == size && ends.dt == DT_U64);
    uint64_t last = 0;
    if (ends.n) memcpy(&last, (const uint8_t *)ends.data + 8 * (ends.n - 1), 8);
    CHECK(!ends.n || last == (uint64_t)tok.n);
    return 0;
}

// npy.h — NumPy .npy records, the format of PithTrain's token files.
// A .bin token file is two back-to-back records: tokens (1-D uint8/16/32/64) and document ends (1-D uint64);
// format 2 adds a third, the loss mask (1-D uint8, one per token: 1 the token is a target, 0 it is not).
#pragma once
#include "base/base.h"

typedef struct {
    DType dt;          // element type from 'descr' (little-endian unsigned/signed ints and floats)
    int64_t n;         // number of elements (1-D arrays only)
    const void *data;  // points into the caller's buffer
    size_t record_len; // header + data bytes: the next record starts here
} NpyRecord;

// Parses one 1-D record at buf[0..len). On failure returns false and writes a reason into err.
bool npy_parse(const uint8_t *buf, size_t len, NpyRecord *rec, char *err, size_t errcap);
// Parses a whole token file at buf[0..len): a token record of unsigned ints, then a uint64 document-end
// record whose ends rise strictly to the token count, then (format 2) a uint8 loss-mask record of one 0 or 1 per
// token or (format 1) nothing: mask->n is 0 and mask->data NULL. On failure returns false with the reason
// ("token record: …", "document-end record: …", "loss-mask record: …") in err.
bool npy_token_file_parse(const uint8_t *buf, size_t len, NpyRecord *tok, NpyRecord *ends, NpyRecord *mask, char *err,
                          size_t errcap);
// Writes the header of a 1-D little-endian array of n elements of dt (version 1.0, 64-byte aligned);
// false when the write fails (errno set).
bool npy_write_header(FILE *f, DType dt, int64_t n);
// The same for a C-order (rows, cols) array.
bool npy_write_header_2d(FILE *f, DType dt, int64_t rows, int64_t cols);

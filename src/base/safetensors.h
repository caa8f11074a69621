// safetensors.h — reading and writing HF safetensors files, single or sharded with model.safetensors.index.json.
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data region. The header maps
// tensor names to {dtype, shape, data_offsets: [begin, end)} (offsets relative to the data region) and may hold a
// "__metadata__" string → string map. Reading is strict: every check the HF reference makes (header ≤ 100 MB, JSON
// object, known dtype, shape × dtype size == end − begin, tensors tiling the data region with no gap or overlap, no
// duplicate keys) is made, and every failure is one line naming the file and the tensor or field.
#pragma once
#include <jansson.h>

#include "base/base.h"

// Every element type a safetensors header may name. pith computes with the first four; the rest can still be
// opened, inspected and copied byte for byte (GPT-OSS MXFP4 blocks are U8, masks BOOL, DeepSeek-V3 weights F8_E4M3).
typedef enum {
    ST_F64,
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U64,
    ST_U32,
    ST_U16,
    ST_U8,
    ST_BOOL,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_F8_E8M0,
    ST_NDTYPE
} StDType;
const char *st_dtype_name(StDType dt); // "BF16"
size_t st_dtype_size(StDType dt);      // bytes per element

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER 100000000 // bytes, as in the HF reference
typedef struct {
    const char *name; // points into the parsed header
    const char *file; // the file it came from, for error messages
    StDType dt;
    int nd; // 0 for a scalar
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data; // into the mapped file; not necessarily aligned
    size_t bytes;
} StTensor;

typedef struct {
    char *path;
    bool mapped;     // map is our mmap of the file (else the caller's buffer)
    const void *map; // the whole file image
    size_t size;
    int n; // tensors, sorted by name
    StTensor *t;
    json_t *header;   // the parsed header (owns the names)
    json_t *metadata; // "__metadata__" (borrowed from header), NULL if absent
} StFile;

// Opens and validates one file. On failure returns false with one line in err ("<path>: ...") and f cleared.
bool st_open(StFile *f, const char *path, char *err, size_t errcap);
void st_open_or_die(StFile *f, const char *path);
// Parses a file image held by the caller (not copied: buf must outlive f). `name` is used in messages.
bool st_parse_buffer(StFile *f, const void *buf, size_t len, const char *name, char *err, size_t errcap);
void st_close(StFile *f);
const StTensor *st_find(const StFile *f, const char *name); // NULL if absent
const char *st_meta(const StFile *f, const char *key);      // NULL if absent

// dst[numel] ← the tensor as fp32; F64/F32/F16/BF16 only (exact except F64), dies naming the tensor otherwise.
void st_read_f32(const StTensor *t, float *dst);
// Dies ("<file>: tensor 'x': shape [2, 3], expected [3, 2]") unless t has exactly this shape.
void st_check_shape(const StTensor *t, int nd, const int64_t *shape);

// A checkpoint that may be sharded: every shard is opened once and the tensors form one table.
// path: a directory (model.safetensors.index.json if present, else model.safetensors), an index file, or one
// .safetensors file. The index's weight_map and the shards must agree exactly, or opening fails naming the tensor.
typedef struct {
    int nfiles;
    StFile *files;
    int n;
    const StTensor **t; // sorted by name
} StSet;

bool st_set_open(StSet *s, const char *path, char *err, size_t errcap);
void st_set_open_or_die(StSet *s, const char *path);
const StTensor *st_set_find(const StSet *s, const char *name);
void st_set_close(StSet *s);

// ---- writing ----
// Collects (name, dtype, shape, pointer) entries; the pointers must stay valid until the write. Files are laid
// out as HF's safetensors writes them (byte for byte the same file as save_file): header entries and data in one
// order, by dtype (widest alignment first, so every tensor is naturally aligned) then by name; the header padded
// with spaces to a multiple of 8 bytes. Written to "<path>.tmp", fsynced and renamed into place. I/O errors and a
// name added twice die naming the path.
typedef struct {
    char *name;
    StDType dt; // dtype in the file
    int nd;
    int64_t shape[ST_MAX_DIMS];
    const void *src;
    bool from_f32; // src is fp32 to convert to dt (F32, F16 or BF16), else raw bytes of dt
} StEntry;

typedef struct {
    int n, cap;
    StEntry *e;
    json_t *metadata; // string → string, written as "__metadata__"
} StWriter;

void st_writer_init(StWriter *w);
void st_writer_free(StWriter *w);
void st_writer_meta(StWriter *w, const char *key, const char *value);
// src: fp32[numel], stored as dt ∈ {F32, F16, BF16}, rounding to nearest even.
void st_writer_add_f32(StWriter *w, const char *name, StDType dt, int nd, const int64_t *shape, const float *src);
// src: numel × st_dtype_size(dt) bytes stored as they are (bit-exact copies, integer and fp8 tensors).
void st_writer_add_raw(StWriter *w, const char *name, StDType dt, int nd, const int64_t *shape, const void *src);
void st_writer_write(const StWriter *w, const char *path);
// Writes to an open stream; `what` names it in errors. Returns the bytes written.
size_t st_writer_write_stream(const StWriter *w, FILE *out, const char *what);
// HF save_pretrained layout in dir: model.safetensors when everything fits in max_shard_bytes, else greedy shards
// (in the order entries were added) model-%05d-of-%05d.safetensors (1-based) plus model.safetensors.index.json
// with metadata.total_size and weight_map. A tensor larger than max_shard_bytes gets a shard of its own.
// Returns the number of shard files written.
int st_writer_write_sharded(const StWriter *w, const char *dir, size_t max_shard_bytes);
// A set over w's entries, read in memory as a file of them would be read (an entry from fp32 reads as its fp32
// source, which the file would round to its dtype); name stands for the file in messages. w and the memory its
// entries point at must outlive s (st_set_close frees only s's own tables).
void st_set_from_writer(StSet *s, const StWriter *w, const char *name);

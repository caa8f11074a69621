// fuzz_safetensors.c — libFuzzer target: arbitrary bytes parsed as a safetensors file image (st_parse_buffer).
// Either the parse fails with one line naming the file, or every tensor lies inside the image, floating tensors
// convert to fp32, and writing the tensors back out (raw bytes, same metadata) and parsing that gives the same
// tensors bit for bit. ASan/UBSan catch out-of-bounds reads, leaks and undefined behaviour on the way.
#include <stdio.h>

#include "base/safetensors.h"

static void check_same(const StFile *a, const StFile *b) {
    CHECK(a->n == b->n);
    for (int i = 0; i < a->n; i++) {
        const StTensor *x = &a->t[i], *y = &b->t[i];
        CHECK(!strcmp(x->name, y->name) && x->dt == y->dt && x->nd == y->nd && x->bytes == y->bytes);
        CHECK(!memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->nd));
        CHECK(!x->bytes || !memcmp(x->data, y->data, x->bytes));
    }
    CHECK(json_equal(a->metadata, b->metadata) || (!a->metadata && !json_object_size(b->metadata)) ||
          (!b->metadata && !json_object_size(a->metadata)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    StFile f;
    char err[512];
    if (!st_parse_buffer(&f, data, size, "fuzz.safetensors", err, sizeof err)) {
        CHECK(!strncmp(err, "fuzz.safetensors: ", 18) && !strchr(err, '\n'));
        return 0;
    }
    StWriter w;
    st_writer_init(&w);
    const char *key;
    json_t *v;
    json_object_foreach(f.metadata, key, v) st_writer_meta(&w, key, json_string_value(v));
    for (int i = 0; i < f.n; i++) {
        const StTensor *t = &f.t[i];
        CHECK((const uint8_t *)t->data >= data && (const uint8_t *)t->data + t->bytes <= data + size);
        CHECK(t->bytes == (size_t)t->numel * st_dtype_size(t->dt));
        if (t->dt == ST_F32 || t->dt == ST_F16 || t->dt == ST_BF16 || t->dt == ST_F64) {
            float *x = xmalloc((size_t)t->numel * sizeof(float));
            st_read_f32(t, x);
            free(x);
        }
        st_writer_add_raw(&w, t->name, t->dt, t->nd, t->shape, t->data);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    CHECK(mem);
    size_t n = st_writer_write_stream(&w, mem, "memory");
    CHECK(fclose(mem) == 0 && n == len && len >= 8);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    CHECK(hlen % 8 == 0);
    StFile g;
    CHECK(st_parse_buffer(&g, buf, len, "again", err, sizeof err));
    check_same(&f, &g);
    st_close(&g);
    free(buf);
    st_writer_free(&w);
    st_close(&f);
    return 0;
}

// tboard.c — TensorBoard event files. A file is a sequence of records, each
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// (TensorFlow's TFRecord format), whose data is one serialized Event (src/train/tboard.proto, encoded by
// protobuf-c). The first Event holds the file version "brain.Event:2"; each later one a step's scalars.
#include "train/tboard.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "tboard.pb-c.h"

// CRC-32C, reflected polynomial 0x82F63B78, one table lookup per byte.
uint32_t tboard_crc32c(const void *data, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

// TensorBoard's masked CRC: (c >> 15 | c << 17) + 0xa282ead8.
static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = tboard_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

// Serializes ev and appends it as one record; the record is written with one fwrite and flushed.
static void write_event(TbWriter *w, const TbEvent *ev) {
    size_t n = tb_event__get_packed_size(ev);
    uint8_t *rec = xmalloc(n + 16);
    put_le(rec, n, 8);
    put_le(rec + 8, masked_crc(rec, 8), 4);
    tb_event__pack(ev, rec + 12);
    put_le(rec + 12 + n, masked_crc(rec + 12, n), 4);
    if (fwrite(rec, 1, n + 16, w->f) != n + 16 || fflush(w->f)) die("%s: cannot write: %s", w->path, strerror(errno));
    free(rec);
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tboard_open(TbWriter *w, const char *run_dir) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    mkdir_p(run_dir);
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d", run_dir, (long long)time(NULL), host,
             (int)getpid());
    w->f = fopen(w->path, "wb");
    if (!w->f) die("%s: cannot create: %s", w->path, strerror(errno));
    TbEvent ev = TB_EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = TB_EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    write_event(w, &ev);
}

void tboard_scalars(TbWriter *w, int64_t step, int n, const char *const *tags, const double *values) {
    TbValue *vals = xcalloc(n, sizeof *vals);
    TbValue **ptrs = xcalloc(n, sizeof *ptrs);
    for (int i = 0; i < n; i++) {
        tb_value__init(&vals[i]);
        vals[i].tag = (char *)tags[i];
        vals[i].value_case = TB_VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = (float)values[i];
        ptrs[i] = &vals[i];
    }
    TbSummary sum = TB_SUMMARY__INIT;
    sum.n_value = n, sum.value = ptrs;
    TbEvent ev = TB_EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = TB_EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    write_event(w, &ev);
    free(vals), free(ptrs);
}

void tboard_close(TbWriter *w) {
    if (w->f && fclose(w->f)) die("%s: cannot write: %s", w->path, strerror(errno));
    w->f = NULL;
}

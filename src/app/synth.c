// synth.c — `pith synth`: writes a synthetic token file in PithTrain's .bin format (docs/reference.md §18).
// The text is an order-1 Markov chain: each token has four successors (chosen by hashing the token)
// taken with probabilities 0.7/0.1/0.1/0.1, so a model can learn it (entropy ≈ 0.94 nats per token).
#include <errno.h>
#include <getopt.h>
#include <unistd.h>

#include "app/app.h"
#include "base/npy.h"

static void synth_usage(FILE *f) {
    fprintf(f, "usage: pith synth --output FILE.bin [--vocab V] [--tokens N] [--seed S] [--eos ID]\n"
               "  writes N tokens (default 65536) over a vocabulary of V (default 256) in documents of 32..512\n"
               "  tokens, each ending with EOS (default V-1); the output's folder is created\n");
}

int cmd_synth(int argc, char **argv) {
    static struct option opts[] = {{"output", 1, 0, 'o'},
                                   {"vocab", 1, 0, 'v'},
                                   {"tokens", 1, 0, 'n'},
                                   {"seed", 1, 0, 's'},
                                   {"eos", 1, 0, 'e'},
                                   {"help", 0, 0, 'h'},
                                   {0}};
    const char *out = NULL;
    long long vocab = 256, ntok = 65536, seed = 1, eos = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'v': vocab = arg_int("synth", "--vocab", optarg, 8, 1LL << 32); break;
        case 'n': ntok = arg_int("synth", "--tokens", optarg, 2, 1LL << 40); break;
        case 's': seed = arg_int("synth", "--seed", optarg, 0, INT64_MAX); break;
        case 'e': eos = arg_int("synth", "--eos", optarg, 0, (1LL << 32) - 1); break;
        case 'h': synth_usage(stdout); return 0;
        default: arg_suggest_option(opts, argv), synth_usage(stderr); return 2;
        }
    }
    if (!out) die("synth: --output is required");
    if (eos < 0) eos = vocab - 1;
    if (eos >= vocab) die("synth: --eos %lld is outside the vocabulary of %lld", eos, vocab);

    uint32_t *tok = xmalloc(ntok * sizeof *tok);
    uint64_t *ends = xmalloc(ntok * sizeof *ends);
    int64_t ndoc = 0, i = 0;
    Rng r = rng_seeded((uint64_t)seed, 0x5e7);
    while (i < ntok) {
        int64_t len = 32 + (int64_t)rng_below(&r, 481);
        uint64_t t = rng_below(&r, (uint64_t)vocab - 1);
        for (int64_t j = 0; j < len - 1 && i < ntok - 1; j++) {
            tok[i++] = (uint32_t)t;
            uint64_t u = rng_below(&r, 10), pick = u < 7 ? 0 : u - 6; // successor 0 with p = 0.7
            t = rng_u64((uint64_t)seed, t, pick) % (uint64_t)(vocab - 1);
        }
        tok[i++] = (uint32_t)eos;
        ends[ndoc++] = (uint64_t)i;
    }
    // Written under <out>.tmp, fsynced and renamed: a failed write leaves nothing under either name.
    char tmp[4096], dir[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    path_dirname(dir, sizeof dir, out);
    mkdir_p(dir);
    FILE *f = fopen(tmp, "wb");
    if (!f) die("%s: cannot write: %s", tmp, strerror(errno));
    bool ok = npy_write_header(f, DT_U32, ntok) && fwrite(tok, sizeof *tok, ntok, f) == (size_t)ntok &&
              npy_write_header(f, DT_U64, ndoc) && fwrite(ends, sizeof *ends, ndoc, f) == (size_t)ndoc && !fflush(f) &&
              !fsync(fileno(f));
    int e = errno;
    if (fclose(f)) ok = false, e = errno;
    if (!ok) unlink(tmp), die("%s: write failed: %s", tmp, strerror(e));
    if (rename(tmp, out)) e = errno, unlink(tmp), die("%s: cannot rename to %s: %s", tmp, out, strerror(e));
    fsync_dir(dir);
    printf("synth: wrote %lld tokens in %lld documents to %s\n", ntok, (long long)ndoc, out);
    free(tok), free(ends);
    return 0;
}

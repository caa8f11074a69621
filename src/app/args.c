// args.c — command-line values shared by the subcommands (see app.h).
#include <errno.h>

#include "app/app.h"
#include "base/base.h"

int64_t arg_int(const char *cmd, const char *opt, const char *val, int64_t lo, int64_t hi) {
    char *end;
    errno = 0;
    long long v = val ? strtoll(val, &end, 10) : 0;
    if (!val || !val[0] || *end || errno == ERANGE || v < lo || v > hi)
        die("%s: %s needs an integer in [%lld, %lld] (got %s%s%s)", cmd, opt, (long long)lo, (long long)hi,
            val ? "'" : "", val ? val : "nothing", val ? "'" : "");
    return v;
}

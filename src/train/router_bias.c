// router_bias.c — the aux-loss-free balancing update (see router_bias.h).
#include "train/router_bias.h"

void router_bias_update(float *bias, const double *load, int E, double rate) {
    double mean = 0;
    for (int e = 0; e < E; e++) mean += load[e];
    mean /= E;
    for (int e = 0; e < E; e++) bias[e] += (float)(rate * ((mean > load[e]) - (mean < load[e])));
}

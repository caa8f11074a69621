// router_bias.h — aux-loss-free load balancing (DeepSeek-V3): a per-expert bias added to the routing scores
// that select each token's top-k (never to the weights), moved once per step towards balance from the expert
// counts of the whole global batch (docs/architecture.md, "Aux-loss-free balancing").
#pragma once
#include "base/base.h"

// bias: (E) += rate · sign(mean − load_e), mean = Σ load / E: an expert above the mean load is chosen less
// next step, one below more; sign(0) = 0, so a balanced router keeps its bias.
void router_bias_update(float *bias, const double *load, int E, double rate);

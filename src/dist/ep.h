// ep.h — stages 2 (dispatch) and 4 (combine) of the layer protocol: moving each token's rows to the
// experts that route them and the expert outputs back. With one expert-parallel rank these are local
// permutations; across ranks the same interface carries the all-to-all (spec §3.2).
#pragma once
#include "model/model.h"

int64_t ep_rows_capacity(const Model *m, int64_t T); // rows stage 3 can receive
void ep_alloc(Model *m, StageIO *io, Arena *a, int64_t T);
void ep_grad_alloc(Model *m, StageIO *io, Arena *ws, int64_t T);
void ep_dispatch_forward(Model *m, StageIO *io);  // xd, idx → perm, offs, xe
void ep_combine_forward(Model *m, StageIO *io);   // ye → y (slot order)
void ep_combine_backward(Model *m, StageIO *io);  // dy → dye
void ep_dispatch_backward(Model *m, StageIO *io); // dxe → dxd

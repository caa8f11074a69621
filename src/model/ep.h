// ep.h — stages 2 (dispatch) and 4 (combine) of the layer protocol: moving each token's rows to the
// experts that route them and the expert outputs back. With one expert-parallel rank these are local
// permutations; across the ep group (model.ep) the same interface carries the all-to-alls of docs/reference.md §12:
// a token goes once to every rank holding any of its experts, every (token, expert) output comes back.
#pragma once
#include "model/model.h"
#include "parallel/comm.h"

// Shared by every layer of a chunk (layers run one at a time): the rows in transit and host scratch for
// building the routes. sbuf, rbuf: (worst case of one layer, H) in the communication arena.
typedef struct EpBuffers {
    int64_t T, cap; // tokens per micro-batch, rows a layer's own stage-3 buffers hold (ep_rows_capacity)
    bool drop;      // rows above cap are dropped (parallel.ep_drop_tokens), else the layer spills
    Tensor sbuf, rbuf;
    int32_t *idx, *perm, *dpos, *expand, *expand_r, *perm_r, *xrow, *send_idx; // host scratch
    int64_t *goffs, *meta_s, *meta_r, *cur;
    int64_t *loffs; // (E_l + 1) the local experts' row offsets, built here and uploaded to the layer's offs
} EpBuffers;

// One layer's route, kept from dispatch to the backward of dispatch. P = ep ranks, E_l = E/P.
typedef struct EpRoute {
    EpBuffers *buf;
    int64_t *send_tok, *recv_tok;   // (P) deduplicated token rows sent to / received from each rank
    int64_t *send_slot, *recv_slot; // (P) (token, expert) slots sent to / received from each rank
    Tensor send_idx;                // (T·min(k, P)) int32: the token of each row sent, grouped by destination rank
    Tensor perm_r; // (capacity) int32: expert-ordered row i ↔ position perm_r[i] in received-slot order
    Tensor xrow;   // (capacity) int32: expert-ordered row i is received token row xrow[i]
    int64_t rows;  // (token, expert) rows this rank received at the last dispatch
    int64_t over;  // of them above the capacity (dropped when dropping)
    bool spill;    // some rank of the group received more than the capacity: stage 3 runs on the spill set
    CommReq req;   // the move in flight between ep_issue and ep_finish
    int pending;   // its EpMove + 1 (0: none)
} EpRoute;

// The four moves of rows, each an all-to-all across the ep group.
typedef enum { EP_DISPATCH, EP_COMBINE, EP_COMBINE_BACKWARD, EP_DISPATCH_BACKWARD } EpMove;

// Rows stage 3 of a layer can receive: the worst case ep·T·min(k, E_l) (T·k on one rank), and the capacity
// its own buffers are sized by, factor·T·k (parallel.ep_capacity_factor; 0 = the worst case). A layer that
// receives more runs on the chunk's spill set (ep_spills) or drops the excess (parallel.ep_drop_tokens).
int64_t ep_rows_worst(const Model *m, int64_t T);
int64_t ep_rows_capacity(const Model *m, int64_t T);
bool ep_spills(const Model *m, int64_t T); // the chunk needs a spill set: capacity below the worst, no dropping
EpRoute *ep_route_create(Model *m, EpBuffers *buf); // NULL with one ep rank
void ep_route_free(EpRoute *r);
void ep_buffers_alloc(Model *m, EpBuffers *b, Arena *comm, int64_t T); // nothing with one ep rank
void ep_buffers_free(EpBuffers *b);
// The stage buffers of a layer (not ye: the caller's; the chunk shares one staging buffer), and their
// gradients, sized by the rows io->xe holds.
void ep_alloc(Model *m, StageIO *io, Arena *a, int64_t T);
void ep_grad_alloc(Model *m, StageIO *io, Arena *ws, int64_t T);
// Each stage as route (dispatch only: the host reads, counts, route->over and route->spill, the rows to
// drop) → issue (pack the rows, post the all-to-all) → finish (wait, unpack), so compute of another
// micro-batch can run between issue and finish (docs/architecture.md, "The overlapped pair"). Between route
// and the dispatch's issue the chunk chooses the layer's stage-3 buffers (its own or the spill set); between
// issue and finish the move's buffers are the transfer's. Row counts: the kept rows, io->rows (= io->offs[E_l]).
// One rank: op_moe_sort writes perm and offs on the device and io->rows is T·k (every slot is a row), so the route
// reads nothing back. Several: the route is built on the host (it needs the counts), offs uploaded from it.
void ep_dispatch_route(Model *m, StageIO *io);    // idx → perm, offs, rows (and the route across ranks)
void ep_issue(Model *m, StageIO *io, EpMove mv);  // one rank: the whole move
void ep_finish(Model *m, StageIO *io);            // the move issued last on io
void ep_dispatch_forward(Model *m, StageIO *io);  // route, issue and finish: xd, idx → perm, offs, xe
void ep_combine_forward(Model *m, StageIO *io);   // ye → y (slot order)
void ep_combine_backward(Model *m, StageIO *io);  // dy → dye
void ep_dispatch_backward(Model *m, StageIO *io); // dxe → dxd

// generate.h — the parts of `pith generate` (docs/architecture.md, "Generation"), for the command and its tests: a
// Generator runs one sequence through a model, forward only, with a KV cache; gen_sample picks the next token.
#pragma once
#include "pipe/chunk.h"

typedef struct {
    Model *m;
    KvCache kv;
    Chunk first, next; // the prompt's chunk (1 × prompt tokens, freed when the next token is fed) and the one-token
                       // chunk; the last one fed keeps its records (its routing: tests/gpu/test_gpu_generate.c)
    Arena ws;          // the logits' temporaries
    float *logits;     // (V) host fp32: the logits of the token after the last one fed
} Generator;

// A generator for a prompt of `prompt` tokens followed by up to cap − prompt more; m's rope tables cover cap
// positions (model_create's max_seq).
void gen_init(Generator *g, Model *m, int prompt, int cap);
// Runs n tokens at the next positions — the prompt first (n = prompt), then one at a time (n = 1) — and leaves the
// logits of the token that follows in g->logits.
void gen_feed(Generator *g, const int32_t *tokens, int n);
void gen_free(Generator *g);
// The next token of logits: (V): the argmax at temperature 0 (the lowest id among equal ones); else a draw from
// softmax(logits / temperature) restricted to the smallest set of most likely tokens whose probability reaches
// top_p (top_p = 1: all of them), as transformers' temperature and top-p warpers do.
int gen_sample(const float *logits, int V, double temperature, double top_p, Rng *rng);

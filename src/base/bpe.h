// bpe.h — byte-level BPE tokenization compatible with Hugging Face `tokenizers` (tokenizer.json).
// bpe_encode gives the ids that HF's Tokenizer.encode gives for the same text with default settings: added tokens
// found in the text are matched as added tokens, the normalizer (NFC/NFD/NFKC/NFKD), the pre-tokenizers (Split with
// the file's regex, ByteLevel, Sequence) and the BPE model (merges, ignore_merges) run as HF runs them. Invalid UTF-8
// is replaced by U+FFFD first (one per maximal invalid subsequence, as Rust's from_utf8_lossy does).
// A loaded Bpe is read-only and shared by threads; each thread encodes with its own BpeScratch.
#pragma once
#include "base/base.h"

typedef struct Bpe Bpe;
typedef struct BpeScratch BpeScratch;

// A growable array of token ids.
typedef struct {
    uint32_t *p;
    size_t n, cap;
} IdVec;
void idvec_push(IdVec *v, uint32_t id);
void idvec_free(IdVec *v);

// path: a tokenizer.json, or a folder holding tokenizer.json. tokenizer_config.json beside it, when present, gives
// bos/eos tokens and add_bos_token/add_eos_token. Dies naming the file and field on anything it cannot honour.
Bpe *bpe_load(const char *path);
void bpe_free(Bpe *t);
BpeScratch *bpe_scratch_new(const Bpe *t);
void bpe_scratch_free(BpeScratch *s);

// Appends the ids of text[0..len) to out. With add_special, the special tokens the tokenizer wraps a text in are
// added too, as transformers' tokenizer(text) does: BOS when tokenizer_config.json says add_bos_token (EOS with
// add_eos_token), otherwise those of tokenizer.json's TemplateProcessing post-processor, if any.
void bpe_encode(const Bpe *t, BpeScratch *s, const char *text, size_t len, bool add_special, IdVec *out);
// The bytes that ids decode to (HF's decode with skip_special_tokens=false, before lossy UTF-8 conversion);
// NUL-terminated, caller frees; *len gets the byte count.
char *bpe_decode(const Bpe *t, const uint32_t *ids, size_t n, size_t *len);

// text[0..n) as valid UTF-8: NULL when it already is, else a fresh NUL-terminated copy (length in *out_len) in which
// each maximal invalid subsequence is replaced by U+FFFD.
char *bpe_utf8_repair(const char *text, size_t n, size_t *out_len);

int64_t bpe_token_to_id(const Bpe *t, const char *token); // vocabulary or added token; -1 if none
int64_t bpe_num_ids(const Bpe *t);                        // 1 + the largest id
// A token named in tokenizer_config.json ("eos_token", "bos_token"), or NULL.
const char *bpe_config_token(const Bpe *t, const char *key);
// True when the tokenizer's normalizer changes text (NFC etc.): decode(encode(x)) is then normalize(x), not x.
bool bpe_has_normalizer(const Bpe *t);
// Applies the tokenizer's normalizer to valid UTF-8 text (for tests); caller frees.
char *bpe_normalize(const Bpe *t, const char *text, size_t len, size_t *out_len);

// Words of at least this many bytes are merged with a heap (O(n log n)); shorter ones with a linear scan. A knob for
// tests, which check that both paths agree.
extern size_t bpe_heap_min_len;
// Pieces of ASCII text are split with an ASCII-only copy of each regex (faster, same result); false turns that off
// (for tests, which check that both give the same ids).
extern bool bpe_ascii_regex;

# fuzz.mk — libFuzzer targets (safetensors files, JSON configs, token files of two or three .npy records), included from the
# Makefile. `make fuzz` builds each target with clang
# (-fsanitize=fuzzer,address,undefined) and runs it for FUZZ_RUNS executions over its committed seed corpus
# tests/fuzz/corpus/<target>/. New inputs libFuzzer finds go to build/fuzz/corpus-<target>/, never into the seeds;
# a crash stops `make fuzz` and leaves the input as build/fuzz/crash-* (rerun: build/fuzz/<target> <file>).
BUILD      ?= build
FUZZ_CC    ?= clang
FUZZ_RUNS  ?= 100000
FUZZ_DIR   := $(BUILD)/fuzz
FUZZ_FLAGS := -std=c11 -g -O1 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -Isrc \
              -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
FUZZ_TARGETS := fuzz_safetensors fuzz_config fuzz_npy

# fuzz_config links json.c alone: the target supplies die() (a longjmp back into the target), path_exists() and
# file_read_all() (it parses from memory, never from a file).
$(FUZZ_DIR)/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c src/base/safetensors.c src/base/base.c src/base/json.c \
                              src/base/safetensors.h src/base/half.h src/base/base.h src/base/json.h
$(FUZZ_DIR)/fuzz_config: tests/fuzz/fuzz_config.c src/base/json.c src/base/json.h src/base/base.h
$(FUZZ_DIR)/fuzz_npy: tests/fuzz/fuzz_npy.c src/base/npy.c src/base/base.c src/base/npy.h src/base/base.h

$(FUZZ_TARGETS:%=$(FUZZ_DIR)/%):
	@mkdir -p $(FUZZ_DIR)
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ -ljansson -lm

.PHONY: fuzz
fuzz: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/%)
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_DIR)/corpus-$$t && echo "== $$t ($(FUZZ_RUNS) runs, log $(FUZZ_DIR)/$$t.log)" && \
	    (cd $(FUZZ_DIR) && ./$$t -runs=$(FUZZ_RUNS) -dict=$(CURDIR)/tests/fuzz/$$t.dict -print_final_stats=1 \
	        corpus-$$t $(CURDIR)/tests/fuzz/corpus/$$t > $$t.log 2>&1) || { tail -40 $(FUZZ_DIR)/$$t.log; exit 1; }; \
	    grep -E "^(#[0-9]+[[:space:]]+DONE|Done|stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb))" $(FUZZ_DIR)/$$t.log; \
	done

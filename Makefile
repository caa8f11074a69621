# pith — build, test and demo. `make` builds build/pith: the CPU backend always, the CUDA backend where it can run
# (nvcc and a GPU; GPU=1 builds it without one, GPU=0 never); `make test` runs the CPU suite; `make test-gpu` the GPU
# suite (on a machine with a GPU); `make demo` runs the embedded default training run end to end. A CUDA build that
# finds NCCL (nccl.h beside nvcc) links it for multi-rank GPU training; `make test-gpu2` runs the two-GPU suite.
# V=1 shows the compiler's command lines.
CC      ?= gcc
NVCC    ?= /usr/local/cuda/bin/nvcc
BUILD   := build
CFLAGS  := -std=c11 -O2 -g -Wall -Wextra -Wno-unused-parameter -fopenmp -D_GNU_SOURCE -Isrc $(EXTRA_CFLAGS)
LDFLAGS := -fopenmp $(EXTRA_LDFLAGS)
LDLIBS  := -lopenblas -ljansson -lpcre2-8 -lutf8proc -lzstd -lz -lprotobuf-c -lcairo -lpthread -lm
# Open MPI's flags, asked from mpicc when a recipe runs (after deps.sh has installed it).
MPI_CFLAGS = $(shell mpicc --showme:compile)
MPI_LIBS   = $(shell mpicc --showme:link)
NVFLAGS := -O2 -g -lineinfo -std=c++17 -Isrc -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xcompiler -fPIC
Q := $(if $(V),,@)

# GPU=auto (the default): the CUDA backend when nvcc exists and nvidia-smi finds a GPU. GPU=1: with nvcc alone (to
# compile-check, or to build binaries for a GPU machine: `make cuda-check`, bench/session.sh). GPU=0 (or CPU_ONLY=1):
# CPU only. A change of backend or flags rebuilds every object ($(BUILD)/.config records them).
GPU ?= auto
ifeq ($(CPU_ONLY),1)
  GPU := 0
endif
ifeq ($(GPU),auto)
  GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
endif
HAVE_NVCC := $(if $(filter 1,$(GPU)),$(shell test -x $(NVCC) && echo 1))
ifeq ($(GPU)$(HAVE_NVCC),1)
  $(error GPU=1 but there is no nvcc at $(NVCC) (set NVCC=...))
endif
CUDA_DIR  := $(patsubst %/bin/nvcc,%,$(NVCC))
HAVE_NCCL := $(shell test -e $(CUDA_DIR)/include/nccl.h && echo 1)
HAVE_CUDNN := $(shell test -e $(CUDA_DIR)/include/cudnn.h -o -e /usr/include/cudnn.h && echo 1)
# FAKE_CUDA=1 (with BUILD=build-fake: `make fake-build`): no GPU code at all; "device" tensors are
# host memory run by the CPU ops and NCCL is MPI underneath, so the NCCL transport runs on CPU machines.
ifeq ($(FAKE_CUDA),1)
  HAVE_NVCC :=
endif
LIB_SRC  := $(filter-out src/app/main.c,$(wildcard src/*/*.c src/ops/cpu/*.c))
CU_SRC   := $(wildcard src/ops/cuda/*.cu)
TEST_SRC := $(wildcard tests/*.c)
GPU_TEST_SRC := $(wildcard tests/gpu/*.c)
PARALLEL_TEST_SRC := $(wildcard tests/parallel/*.c)
ifeq ($(HAVE_NVCC),1)
  CFLAGS += -DPITH_CUDA
  CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.o)
  LDLIBS += -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lcublasLt -lstdc++
  ifeq ($(HAVE_CUDNN),1)
    NVFLAGS += -DPITH_CUDNN
    CFLAGS += -DPITH_CUDNN
    LDLIBS += -lcudnn
  endif
  ifeq ($(HAVE_NCCL),1)
    CFLAGS += -DPITH_NCCL -I$(CUDA_DIR)/include
    LDLIBS += -lnccl
  endif
endif
ifeq ($(FAKE_CUDA),1)
  CFLAGS += -DPITH_CUDA -DPITH_NCCL -DPITH_FAKE_CUDA -Itests/fake/include
  CU_OBJ := $(BUILD)/tests/fake/fake_cuda.o
endif
# Code protoc-c generates from src/train/*.proto (TensorBoard's event records) into $(BUILD)/gen/.
PROTO    := $(wildcard src/train/*.proto)
PROTO_C  := $(PROTO:src/train/%.proto=$(BUILD)/gen/%.pb-c.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(PROTO_C:%.c=%.o) $(CU_OBJ)
DEPS_OK  := build/.deps-ok # one stamp for every build folder: deps.sh installs for the machine and the checkout
BACKEND  := $(if $(HAVE_NVCC),CPU + CUDA,$(if $(filter 1,$(FAKE_CUDA)),CPU + fake GPUs,CPU only))
define LINK
@echo "  link $@ ($(BACKEND))"
$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(MPI_LIBS)
endef
CONFIG   := cuda=$(HAVE_NVCC) cudnn=$(HAVE_CUDNN) nccl=$(HAVE_NCCL) fake=$(FAKE_CUDA) cc=$(CC) extra=$(EXTRA_CFLAGS)

.PHONY: all test test-portable test-asan test-gpu test-gpu2 fake-build cuda-check bench-gpu demo clean clean-tests \
        format format-check FORCE
all: $(BUILD)/pith

# What the objects were built with; rewritten (so every object is rebuilt) only when it changes.
$(BUILD)/.config: FORCE
	@mkdir -p $(BUILD) && echo '$(CONFIG)' | cmp -s - $@ || echo '$(CONFIG)' >$@

# scripts/deps.sh installs the Debian packages (and tokenizer data) the build needs; it is idempotent.
$(DEPS_OK): scripts/deps.sh
	@bash scripts/deps.sh
	@mkdir -p $(dir $@) && touch $@

$(BUILD)/%.o: %.c $(BUILD)/.config | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) $(MPI_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: src/train/%.proto | $(DEPS_OK)
	@mkdir -p $(BUILD)/gen
	$(Q)protoc-c --c_out=$(BUILD)/gen --proto_path=src/train $<

$(BUILD)/gen/%.pb-c.o: $(BUILD)/gen/%.pb-c.c
	$(Q)$(CC) $(CFLAGS) -I$(BUILD)/gen -MMD -MP -c $< -o $@

$(BUILD)/src/train/tboard.o: CFLAGS += -I$(BUILD)/gen
$(BUILD)/src/train/tboard.o: $(PROTO_C:%.c=%.h)

$(BUILD)/%.o: %.cu $(BUILD)/.config | $(DEPS_OK)
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  nvcc $<")
	$(Q)$(NVCC) $(NVFLAGS) -DPITH_CUDA -MMD -MP -c $< -o $@

$(BUILD)/pith: $(BUILD)/src/app/main.o $(LIB_OBJ)
	$(LINK)

$(BUILD)/test_pith: $(TEST_SRC:%.c=$(BUILD)/%.o) $(LIB_OBJ)
	$(LINK)

# The multi-rank worker: tests/parallel/*.c, run under mpirun by the suite (tests/test_parallel.c).
$(BUILD)/test_parallel: $(PARALLEL_TEST_SRC:%.c=$(BUILD)/%.o) $(LIB_OBJ)
	$(LINK)

# The GPU suite: tests/gpu/*.c with the runner of tests/main.c (the CPU tests stay in test_pith).
$(BUILD)/test_gpu: $(GPU_TEST_SRC:%.c=$(BUILD)/%.o) $(BUILD)/tests/main.o $(LIB_OBJ)
	$(if $(HAVE_NVCC)$(filter 1,$(FAKE_CUDA)),,$(error $@ needs the CUDA backend, and no GPU answers here: make GPU=1 $@))
	$(LINK)

# With the CUDA backend the GPU suite is linked too (not run); without one, `make cuda-check` (CI) compiles it.
test: $(BUILD)/pith $(BUILD)/test_pith $(BUILD)/test_parallel fake-build $(if $(HAVE_NVCC),$(BUILD)/test_gpu)
	@$(MAKE) --no-print-directory format-check
	@$(BUILD)/test_pith
	@$(MAKE) --no-print-directory test-portable
	@$(MAKE) --no-print-directory fuzz

# The tests that claim bit-identity (layouts against one process, resume, the pipeline, context parallelism, FP8
# layouts, recompute, offload) once more with 3 OpenMP threads and another OpenBLAS kernel family than this CPU's
# own: their results must depend on neither (docs/architecture.md, "Determinism on the CPU").
PORTABLE_TESTS := dist_equivalence dist_cp_ dist_pipeline dist_reshard resume pipe_ fp8_model_ bit_identical
test-portable: $(BUILD)/pith $(BUILD)/test_pith $(BUILD)/test_parallel fake-build
	@core=$$($(BUILD)/test_pith --other-blas-core) && echo "test-portable: OMP_NUM_THREADS=3 OPENBLAS_CORETYPE=$$core" && \
	  OMP_NUM_THREADS=3 OPENBLAS_CORETYPE=$$core $(BUILD)/test_pith $(PORTABLE_TESTS)

# The CPU suite built with AddressSanitizer and UndefinedBehaviorSanitizer (in build-asan/). The suite also runs
# the multi-rank worker (build/test_parallel) and the fake-GPU build (build-fake/), built first like `make test`.
test-asan: $(BUILD)/test_parallel fake-build
	@$(MAKE) --no-print-directory BUILD=build-asan CPU_ONLY=1 EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	    EXTRA_LDFLAGS="-fsanitize=address,undefined" build-asan/pith build-asan/test_pith
	@ASAN_OPTIONS=detect_leaks=0 PITH_BIN=build-asan/pith build-asan/test_pith

test-gpu: $(BUILD)/pith $(BUILD)/test_gpu
	@PITH_TEST_GPU=1 $(BUILD)/test_gpu

# The two-GPU suite (tests/gpu/test_gpu_parallel.c: NCCL collectives, EP, timeouts and layout equivalence under
# mpirun -np 2, with build/test_parallel); part of test-gpu too, where it says "skipped" with fewer than two GPUs.
test-gpu2: $(BUILD)/pith $(BUILD)/test_gpu $(BUILD)/test_parallel
	@PITH_TEST_GPU=1 $(BUILD)/test_gpu gpu2_

# Every CUDA source and the GPU suite compiled and linked (into build-cuda/) where nvcc exists, GPU or not: CI runs
# it (.ci/run), so a kernel that stops compiling fails CI on a machine with no GPU.
cuda-check: | $(DEPS_OK) # before the sub-make, so that make -j2 test runs deps.sh once
	@$(MAKE) --no-print-directory BUILD=build-cuda GPU=1 build-cuda/pith build-cuda/test_gpu

# The NCCL transport on a machine without a GPU: pith and test_parallel built with FAKE_CUDA=1 into
# build-fake/ (tests/fake/fake_cuda.c: device memory is host memory, NCCL is MPI, stream order is checked);
# tests/test_parallel.c runs them.
fake-build: | $(DEPS_OK)
	@$(MAKE) --no-print-directory BUILD=build-fake FAKE_CUDA=1 build-fake/pith build-fake/test_parallel

# Kernel timings at Qwen3-30B-A3B sizes (GPU machine only).
$(BUILD)/bench_gpu_ops: $(BUILD)/bench/bench_gpu_ops.o $(LIB_OBJ)
	$(LINK)

bench-gpu: $(BUILD)/bench_gpu_ops
	@$(BUILD)/bench_gpu_ops

# EP dispatch + combine over NCCL, one rank per GPU (bench/run_gpu2.sh runs it beside its PyTorch peer).
$(BUILD)/bench_ep: $(BUILD)/bench/bench_ep.o $(LIB_OBJ)
	$(LINK)

# Ring attention at cp ranks, one per GPU, against the attention op alone (bench/run_cp2.sh).
$(BUILD)/bench_ring: $(BUILD)/bench/bench_ring.o $(LIB_OBJ)
	$(LINK)

demo: $(BUILD)/pith
	@bash scripts/demo.sh

clean:
	rm -rf $(BUILD) build-asan build-fake build-cuda

# The folders a failed test kept (the runner names them) and Open MPI session folders the suite made.
# The folders of test processes that have ended (pith-test-PID-*, pith-ompi-PID), not those of a suite still running.
clean-tests:
	@for d in /tmp/pith-test-* /tmp/pith-ompi-*; do \
	    p=$${d#/tmp/pith-*-}; p=$${p%%-*}; [ -e "$$d" ] && ! kill -0 "$$p" 2>/dev/null && rm -rf "$$d"; done; true

# The C and CUDA sources under .clang-format: `make format` rewrites them, `make format-check` lists the files
# it would change and fails when there are any.
FORMAT_SRC = $(shell git ls-files 'src/*.[ch]' 'src/*.cu' 'src/*.cuh' 'tests/*.[ch]' 'bench/*.[ch]')
format:
	clang-format -i $(FORMAT_SRC)

format-check:
	@bad=0; for f in $(FORMAT_SRC); do clang-format --dry-run -Werror $$f >/dev/null 2>&1 || { echo "$$f"; bad=1; }; done; \
	  if [ $$bad = 1 ]; then echo "format-check: the files above differ from .clang-format (make format)"; exit 1; fi

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
include tests/fuzz/fuzz.mk

# kiln build. `make` builds build/libkiln.a, build/kiln, tests and benchmarks.
# `make test` runs the suite; `make asan` builds it with ASan+UBSan into build-asan/
# (where every graph pass is followed by kiln_graph_verify, and cpu-isolated
# memory is PROT_NONE outside its backend calls: -DKILN_STRICT_DEVICE).
BUILD    ?= build
CC       ?= cc
OPT      ?= -O3 -march=native
SAN      ?=
CFLAGS   := -std=c11 -D_GNU_SOURCE $(OPT) -ffp-contract=off -fopenmp -Wall -Wextra -Werror -Iinclude -MMD -MP $(SAN) $(EXTRA_CFLAGS)
LDLIBS   := -ldnnl -ljansson -lpcre2-8 -lutf8proc -lm -ldl -lpthread
LDFLAGS  := -fopenmp $(SAN)

# MPI (data-parallel training) when mpicc is found; include dirs go in as
# -isystem so Open MPI's headers never trip -Werror. Without it the build is
# single-process and `kiln train` under mpirun says so.
MPICC    ?= $(shell command -v mpicc 2>/dev/null)
ifneq ($(strip $(MPICC)),)
MPI_INC  := $(patsubst -I%,-isystem %,$(shell $(MPICC) --showme:compile 2>/dev/null))
MPI_LIB  := $(shell $(MPICC) --showme:link 2>/dev/null)
ifneq ($(strip $(MPI_LIB)),)
CFLAGS   += -DKILN_MPI $(MPI_INC)
LDLIBS   += $(MPI_LIB)
endif
endif

LIB_SRC   := $(sort $(wildcard src/core/*.c src/kernels/*.c src/ops/*.c src/eager/*.c src/graph/*.c src/compile/*.c src/model/*.c src/backend/*.c src/backend/*/*.c src/tokenizer/*.c src/template/*.c src/formats/*.c src/data/*.c src/train/*.c))
CLI_SRC   := $(sort $(wildcard src/cli/*.c))
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)

# The kernels with one form per instruction set (kiln/simd.h): each file of
# src/kernels/simd/ is compiled once per form, with the form's -march in
# place of the build's and -DKILN_FORM naming its symbols; which form runs
# is chosen at start (src/kernels/dispatch.c). Other architectures build one
# form, portable, with the build's own flags.
SIMD_SRC  := $(sort $(wildcard src/kernels/simd/*.c))
ifeq ($(shell uname -m),x86_64)
SIMD_FORMS := portable avx2 avx512
FORM_DROP  := -march=%
FORM_ARCH_portable := -march=x86-64 -mtune=native
FORM_ARCH_avx2     := -march=x86-64-v3 -mtune=native
FORM_ARCH_avx512   := -march=x86-64-v4 -mtune=native
else
SIMD_FORMS := portable
endif
SIMD_OBJ  := $(foreach f,$(SIMD_FORMS),$(SIMD_SRC:%.c=$(BUILD)/%.$(f).o))
LIB_OBJ   += $(SIMD_OBJ)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

all: $(BUILD)/libkiln.a $(BUILD)/kiln $(TEST_BIN) $(BENCH_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

define simd_form_rule
$$(BUILD)/src/kernels/simd/%.$(1).o: src/kernels/simd/%.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(filter-out $$(FORM_DROP),$$(CFLAGS)) $$(FORM_ARCH_$(1)) -DKILN_FORM=$(1) -c $$< -o $$@
endef
$(foreach f,$(SIMD_FORMS),$(eval $(call simd_form_rule,$(f))))

# The code generator embeds the ops' scalar math (include/kiln/opmath.h) as
# text, so generated modules compute what the kernels compute: each line of
# the header becomes one line of a C string literal.
$(BUILD)/gen/opmath_text.h: include/kiln/opmath.h
	@mkdir -p $(dir $@)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $< > $@.tmp && mv $@.tmp $@

$(BUILD)/src/backend/cpu/render_c.o: $(BUILD)/gen/opmath_text.h
$(BUILD)/src/backend/cpu/render_c.o: CFLAGS += -I$(BUILD)/gen

$(BUILD)/libkiln.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/kiln: $(CLI_OBJ) $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: all
	bash tests/run.sh $(BUILD)

# Sanitizer builds: gcc's -fsanitize=undefined leaves out float-cast-overflow,
# so it is named. asan-clang is the same suite built with clang (-Wno-pass-failed:
# clang reports `omp simd` loops it leaves scalar at -O1 as warnings).
# -DKILN_GRAPH_VERIFY: every graph pass is followed by kiln_graph_verify there.
# Every UBSan report stops the program. gcc: -fno-sanitize-recover=all.
# clang: with ASan beside it that flag took clang 38 s on the AVX-512 form of
# attention.c alone (4.9 s without; 75 s for the library against 57), so
# clang's reports stay recoverable in the code and KILN_UBSAN_HALT compiles
# halt_on_error=1 into UBSan's defaults (src/core/error.c).
# -g1: line tables, all a sanitizer's report shows (the gcc build 63 s against 85).
SAN_CHECKS      := -fsanitize=address,undefined,float-cast-overflow
SAN_FLAGS       := $(SAN_CHECKS) -fno-sanitize-recover=all -DKILN_GRAPH_VERIFY -DKILN_STRICT_DEVICE
SAN_FLAGS_CLANG := $(SAN_CHECKS) -DKILN_UBSAN_HALT -DKILN_GRAPH_VERIFY -DKILN_STRICT_DEVICE
SAN_OPT         := -O1 -g1 -march=native -fno-omit-frame-pointer
# (The sanitizer builds leave out the benchmarks: nothing runs them there.)
asan:
	$(MAKE) BUILD=build-asan OPT="$(SAN_OPT)" SAN="$(SAN_FLAGS)" tested

asan-clang:
	$(MAKE) BUILD=build-clang CC=clang OPT="$(SAN_OPT)" SAN="$(SAN_FLAGS_CLANG)" EXTRA_CFLAGS=-Wno-pass-failed tested

tested: $(BUILD)/libkiln.a $(BUILD)/kiln $(TEST_BIN)

# libFuzzer harnesses (tests/fuzz/fuzz_*.c), clang only: `make fuzz` builds
# them and runs each for FUZZ_SECONDS (default 60) on its seed corpus
# (tests/fuzz/corpus/NAME, new inputs go to build-fuzz/corpus/NAME);
# `make fuzz-check` runs each over a fixed number of executions.
# FUZZ_DIR: the build whose libkiln.a the harnesses link (into FUZZ_DIR/fuzz/).
# build-fuzz's library carries libFuzzer's coverage instrumentation, which
# searching for new inputs needs. CI (`make fuzz-ci`, scripts/test.sh) only
# replays the seeds for a fixed number of runs so that no harness rots: it
# links them against the clang ASan+UBSan build's library (build-clang), one
# whole build of the library fewer.
FUZZ_SRC   := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_DIR   ?= build-fuzz
FUZZ_BIN   := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_DIR)/fuzz/%)
FUZZ_SECONDS ?= 60
FUZZ_RUNS  ?= 3000
fuzz-build:
	$(MAKE) BUILD=build-fuzz CC=clang OPT="$(SAN_OPT)" SAN="-fsanitize=fuzzer-no-link $(SAN_CHECKS) -DKILN_UBSAN_HALT" EXTRA_CFLAGS=-Wno-pass-failed build-fuzz/libkiln.a
	$(MAKE) FUZZ_DIR=build-fuzz CC=clang OPT="$(SAN_OPT)" EXTRA_CFLAGS=-Wno-pass-failed fuzz-bins

fuzz-ci: asan-clang
	$(MAKE) FUZZ_DIR=build-clang CC=clang OPT="$(SAN_OPT)" EXTRA_CFLAGS=-Wno-pass-failed fuzz-bins

fuzz-bins: $(FUZZ_BIN)

$(FUZZ_DIR)/fuzz/%: tests/fuzz/%.c $(FUZZ_DIR)/libkiln.a tests/fuzz/fuzz.h
	@mkdir -p $(dir $@)
	clang $(CFLAGS) -Wno-pass-failed -fsanitize=fuzzer $(SAN_CHECKS) -o $@ $< $(FUZZ_DIR)/libkiln.a $(LDLIBS)

fuzz: fuzz-build
	FUZZ_DIR=build-fuzz bash tests/fuzz/run.sh time $(FUZZ_SECONDS)

fuzz-check: fuzz-build
	FUZZ_DIR=build-fuzz bash tests/fuzz/run.sh runs $(FUZZ_RUNS)

clean:
	rm -rf build build-asan build-clang build-fuzz

.PHONY: all tested test asan asan-clang fuzz fuzz-build fuzz-ci fuzz-bins fuzz-check clean
.SECONDARY:
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:=.d) $(BENCH_BIN:=.d)

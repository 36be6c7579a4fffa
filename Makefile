# kiln build. `make` builds build/libkiln.a, build/kiln, tests and benchmarks.
# `make test` runs the suite; `make asan` builds it with ASan+UBSan into build-asan/.
BUILD    ?= build
CC       ?= cc
OPT      ?= -O3 -march=native
SAN      ?=
CFLAGS   := -std=c11 -D_GNU_SOURCE $(OPT) -fopenmp -Wall -Wextra -Werror -Iinclude -MMD -MP $(SAN) $(EXTRA_CFLAGS)
LDLIBS   := -ldnnl -ljansson -lm -ldl -lpthread
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

LIB_SRC   := $(sort $(wildcard src/core/*.c src/kernels/*.c src/ops/*.c src/eager/*.c src/graph/*.c src/compile/*.c src/model/*.c src/data/*.c src/train/*.c))
CLI_SRC   := $(sort $(wildcard src/cli/*.c))
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

all: $(BUILD)/libkiln.a $(BUILD)/kiln $(TEST_BIN) $(BENCH_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libkiln.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/kiln: $(CLI_OBJ) $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# bench/gemm also measures OpenBLAS as a candidate.
$(BUILD)/bench/gemm: $(BUILD)/bench/gemm.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lopenblas

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: all
	bash tests/run.sh $(BUILD)

asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -g -march=native -fno-omit-frame-pointer" SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"

clean:
	rm -rf build build-asan

.PHONY: all test asan clean
.SECONDARY:
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:=.d) $(BENCH_BIN:=.d)

# tokpipe — the one Makefile (GNU make). Dependencies come from pkg-config.
#
#   make            build bin/tokpiped, bin/tokpipe-worker, bin/tokpipe
#   make test       build and run the test suite (unit + integration + python)
#   make asan       the same tests built with ASan+UBSan (into build-asan/)
#   make fuzz       run every libFuzzer target for FUZZ_SECONDS each (clang)
#   make check      deps + test + asan + fuzz: what CI runs
#   make bench      benchmarks (ratios against baselines measured in the run)
#   make run        the newcomer demo: daemon + workers + a streamed sample job
#   make deps       install missing Debian packages (apt-get, needs root/sudo)
#
# Layout is discovered, not listed: every .c under common/ protocol/ config/
# and workers/<stage>/ goes into the library; tools/cmd_NAME.c becomes the
# subcommand `tokpipe NAME`; tests/test_*.c and tests/it_*.c are test binaries;
# fuzz/fuzz_*.c are fuzz targets; bench/bench_*.c are benchmarks.

CC       ?= cc
FUZZ_CC  ?= clang
PKGS     := libzmq msgpack openblas yaml-0.1 libsystemd libcjson
SAN      ?= 0
FUZZ_SECONDS ?= 30
# Build lines are short ("CC file"); `make V=1` shows the full commands.
V ?= 0
ifeq ($(V),1)
Q :=
else
Q := @
endif

ifeq ($(SAN),1)
BUILD    ?= build-asan
BIN      ?= $(BUILD)/bin
OPTFLAGS ?= -O1 -g -fno-omit-frame-pointer
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all
else
BUILD    ?= build
BIN      ?= bin
OPTFLAGS ?= -O2 -g -march=native
SANFLAGS :=
endif

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
TEST_LIBS  := $(shell pkg-config --libs cmocka 2>/dev/null)

CFLAGS  += -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE $(OPTFLAGS) $(SANFLAGS) \
           -Iinclude -I$(BUILD)/gen $(PKG_CFLAGS) -MMD -MP
# --as-needed explicitly: gcc drops it under -fsanitize, which made every
# sanitizer build load libopenblas, whose thread pool starts at load with
# signals unblocked and takes SIGINT/SIGTERM from signalfd/poll loops.
LDFLAGS += $(SANFLAGS) -Wl,--as-needed
LDLIBS  += $(PKG_LIBS) -lm -lpthread

LIB_SRC    := $(wildcard common/*.c protocol/*.c config/*.c workers/*/*.c)
DAEMON_SRC := $(wildcard daemon/*.c)
DLIB_SRC   := $(filter-out daemon/main.c,$(DAEMON_SRC))
WORKER_SRC := $(wildcard workers/*.c)
TOOLS_SRC  := $(wildcard tools/*.c)
CMD_NAMES  := $(sort $(patsubst tools/cmd_%.c,%,$(wildcard tools/cmd_*.c)))
TEST_SRC   := $(wildcard tests/test_*.c tests/it_*.c)
TSUP_SRC   := $(wildcard tests/support/*.c)
FUZZ_SRC   := $(wildcard fuzz/fuzz_*.c)
BENCH_SRC  := $(wildcard bench/bench_*.c)
BSUP_SRC   := $(wildcard bench/support/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB        := $(BUILD)/libtokpipe.a
PROGRAMS   := $(BIN)/tokpipe
ifneq ($(wildcard daemon/main.c),)
PROGRAMS   += $(BIN)/tokpiped
endif
ifneq ($(WORKER_SRC),)
PROGRAMS   += $(BIN)/tokpipe-worker
endif
TESTS      := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCHES    := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.SECONDARY:
.PHONY: all test asan fuzz check bench run deps clean FORCE
all: $(PROGRAMS)

$(BUILD)/obj/%.o: %.c | $(BUILD)/gen/cmds.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(call obj,$(LIB_SRC))
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

# The subcommand table is generated from the tools/cmd_*.c files present, and
# rewritten only when that list changes so nothing rebuilds needlessly.
$(BUILD)/gen/cmds.h: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' $(foreach c,$(CMD_NAMES),'TP_CMD($(c))') > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@

$(BIN)/tokpiped: $(call obj,$(DAEMON_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/tokpipe-worker: $(call obj,$(WORKER_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/tokpipe: $(call obj,$(TOOLS_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(call obj,$(TSUP_SRC) $(DLIB_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TEST_LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(call obj,$(BSUP_SRC) $(DLIB_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: $(PROGRAMS) $(TESTS)
	BUILD=$(BUILD) BIN=$(BIN) scripts/run-tests.sh

asan:
	$(MAKE) SAN=1 test

# Fuzz targets are built with clang's libFuzzer plus ASan/UBSan from their own
# object tree so the normal build stays gcc.
FUZZ_BUILD := build-fuzz
FUZZ_CFLAGS := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -O1 -g \
               -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
               -Iinclude -I$(BUILD)/gen $(PKG_CFLAGS) -MMD -MP
FUZZ_LIB_OBJ := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(LIB_SRC))
FUZZ_BINS := $(patsubst fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRC))

$(FUZZ_BUILD)/obj/%.o: %.c | $(BUILD)/gen/cmds.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $< (fuzz)")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/obj/fuzz/fuzz_%.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS)

fuzz: $(FUZZ_BINS)
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/run-fuzz.sh $(FUZZ_BINS)

check: deps
	$(MAKE) test
	$(MAKE) asan
	$(MAKE) fuzz

bench: all $(BENCHES)
	BUILD=$(BUILD) BIN=$(BIN) scripts/run-bench.sh $(BENCHES)

run: deps
	$(MAKE) all
	BIN=$(BIN) scripts/run-demo.sh

deps:
	scripts/install-deps.sh

clean:
	rm -rf build build-asan build-fuzz bin

-include $(shell find $(BUILD) $(FUZZ_BUILD) -name '*.d' 2>/dev/null)

# tokpipe — the one Makefile (GNU make). Dependencies come from pkg-config.
#
#   make            build bin/tokpiped, bin/tokpipe-worker, bin/tokpipe
#   make test       build and run the test suite (unit + integration + python)
#   make asan       the same tests built with ASan+UBSan (into build-asan/)
#   make fuzz       run every libFuzzer target for FUZZ_SECONDS each (clang)
#   make check      deps + test + asan + fuzz (CHECK_FUZZ_SECONDS each): what CI runs
#   make bench      benchmarks (ratios against baselines measured in the run)
#   make run        the newcomer demo: daemon + workers + a streamed sample job
#   make deps       install missing Debian packages (apt-get, needs root/sudo)
#   make install    copy the built programs, config, systemd units and docs
#                   under $(DESTDIR)$(PREFIX) (default /usr/local; see below)
#   make uninstall  remove them again (a config you edited stays)
#
# Layout is discovered, not listed: every .c under common/ protocol/ config/
# net/ model/ and workers/<stage>/ go into the library; tools/cmd_NAME.c becomes the
# subcommand `tokpipe NAME`; tests/test_*.c and tests/it_*.c are test binaries;
# fuzz/fuzz_*.c are fuzz targets; bench/bench_*.c are benchmarks.

CC       ?= cc
FUZZ_CC  ?= clang
PKGS     := libzmq msgpack openblas yaml-0.1 libsystemd libcjson libpcre2-8 libutf8proc libmicrohttpd libedit
SAN      ?= 0
FUZZ_SECONDS ?= 30
# make check's share per target: a smoke run that keeps CI under 20 minutes
# (the suite runs twice, plain and sanitized); make fuzz goes longer
CHECK_FUZZ_SECONDS ?= 15
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
# -O2 as the normal build: the same code paths checked, and the ASan suite
# runs in a third less time than at -O1 (CI's budget is 20 minutes)
OPTFLAGS ?= -O2 -g -fno-omit-frame-pointer
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all
else
BUILD    ?= build
BIN      ?= bin
# No -march=native: the kernels pick AVX-512 / VNNI at run time (function
# targets), so one binary runs on any x86-64 (measured: no slower).
OPTFLAGS ?= -O2 -g
SANFLAGS :=
endif

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
TEST_LIBS  := $(shell pkg-config --libs cmocka 2>/dev/null)

# -ffp-contract=off: a product and a sum stay two roundings unless the code
# says fmaf; the portable kernels' bits (which every vector path gives) must
# not depend on a compiler's default (gcc's -std=c11 has it off, clang's on).
CFLAGS  += -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -ffp-contract=off $(OPTFLAGS) $(SANFLAGS) \
           -Iinclude -I$(BUILD)/gen $(PKG_CFLAGS) -MMD -MP
# --as-needed explicitly: gcc drops it under -fsanitize, which made every
# sanitizer build load libopenblas, whose thread pool starts at load with
# signals unblocked and takes SIGINT/SIGTERM from signalfd/poll loops.
LDFLAGS += $(SANFLAGS) -Wl,--as-needed
LDLIBS  += $(PKG_LIBS) -lm -lpthread

LIB_SRC    := $(wildcard common/*.c protocol/*.c config/*.c net/*.c model/*.c workers/*/*.c)
DAEMON_SRC := $(wildcard daemon/*.c)
DLIB_SRC   := $(filter-out daemon/main.c,$(DAEMON_SRC))
WORKER_SRC := $(wildcard workers/*.c)
HTTP_SRC   := $(wildcard http/*.c)
TOOLS_SRC  := $(wildcard tools/*.c)
CMD_NAMES  := $(sort $(patsubst tools/cmd_%.c,%,$(wildcard tools/cmd_*.c)))
TEST_SRC   := $(wildcard tests/test_*.c tests/it_*.c)
TSUP_SRC   := $(wildcard tests/support/*.c)
FUZZ_SRC   := $(wildcard fuzz/fuzz_*.c)
BENCH_SRC  := $(wildcard bench/bench_*.c)
# benches of whole processes (daemons, gateway, clients) are Python scripts
BENCH_PY   := $(wildcard bench/bench_*.py)
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
ifneq ($(HTTP_SRC),)
PROGRAMS   += $(BIN)/tokpipe-http
endif
TESTS      := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCHES    := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.SECONDARY:
.PHONY: all test test-build asan fuzz fuzz-build check bench run deps clean install uninstall FORCE
all: $(PROGRAMS)

# Objects depend on the compile flags too: a new OPTFLAGS or SAN rebuilds.
$(BUILD)/cflags: FORCE
	@mkdir -p $(dir $@)
	@echo '$(CC) $(CFLAGS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS)' > $@

$(BUILD)/obj/%.o: %.c $(BUILD)/cflags | $(BUILD)/gen/cmds.h
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

$(BIN)/tokpipe-http: $(call obj,$(HTTP_SRC)) $(LIB)
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

# the gateway's request decoder is tested beside the library
$(BUILD)/tests/test_oai: $(BUILD)/obj/tests/test_oai.o $(call obj,http/oai.c http/lp.c) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TEST_LIBS)
$(BUILD)/tests/test_rstore: $(BUILD)/obj/tests/test_rstore.o $(call obj,http/rstore.c) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TEST_LIBS)
$(BUILD)/tests/test_anthropic: $(BUILD)/obj/tests/test_anthropic.o $(call obj,http/anthropic.c http/apijson.c http/oai.c http/lp.c) \
		$(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TEST_LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(call obj,$(BSUP_SRC) $(DLIB_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# bench_forward's llama2.c baseline is built the way llama2.c builds run.c
# for speed (`make runomp`: -Ofast -march=native -fopenmp), not with ours.
BASE_SRC    := $(wildcard bench/baseline/*.c)
BASE_CFLAGS := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -O3 -march=native -ffast-math -fopenmp -MMD -MP

$(BUILD)/obj/bench/baseline/%.o: bench/baseline/%.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $< (llama2.c's flags)")
	$(Q)$(CC) $(BASE_CFLAGS) -c $< -o $@

$(BUILD)/bench/bench_forward: $(call obj,$(BASE_SRC))
$(BUILD)/bench/bench_forward: LDFLAGS += -fopenmp

test: $(PROGRAMS) $(TESTS)
	BUILD=$(BUILD) BIN=$(BIN) scripts/run-tests.sh

# what `test` runs, built and not run (make check builds ahead with it)
test-build: $(PROGRAMS) $(TESTS)

asan:
	$(MAKE) SAN=1 test

# Fuzz targets are built with clang's libFuzzer plus ASan/UBSan from their own
# object tree so the normal build stays gcc.
FUZZ_BUILD := build-fuzz
FUZZ_CFLAGS := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -ffp-contract=off -O1 -g -DTP_NO_UNROLL \
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

# the gateway's request decoder lives beside the gateway, not in the library
$(FUZZ_BUILD)/fuzz_oai_request: $(FUZZ_BUILD)/obj/fuzz/fuzz_oai_request.o $(FUZZ_BUILD)/obj/http/oai.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS)
$(FUZZ_BUILD)/fuzz_anthropic_request: $(FUZZ_BUILD)/obj/fuzz/fuzz_anthropic_request.o $(FUZZ_BUILD)/obj/http/anthropic.o \
		$(FUZZ_BUILD)/obj/http/apijson.o $(FUZZ_BUILD)/obj/http/oai.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS)

fuzz-build: $(FUZZ_BINS)

fuzz: $(FUZZ_BINS)
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/run-fuzz.sh $(FUZZ_BINS)

# The three builds use every CPU. The tests run one at a time and leave
# much of the machine idle (one process computing, or processes waiting on
# each other), so while a suite runs the next build goes on beside it at
# the lowest priority (nice 19: it gets only what the tests leave); its
# output goes to a log under build/, and the make after it builds whatever
# it did not (and shows any error).
NPROC := $(shell nproc 2>/dev/null || echo 2)
check: deps
	$(MAKE) -j$(NPROC) test-build
	nice -n 19 $(MAKE) -j$(NPROC) SAN=1 test-build >$(BUILD)/ahead-asan.log 2>&1 & \
	  $(MAKE) test; rc=$$?; wait; exit $$rc
	nice -n 19 $(MAKE) -j$(NPROC) fuzz-build >$(BUILD)/ahead-fuzz.log 2>&1 & \
	  $(MAKE) -j$(NPROC) asan; rc=$$?; wait; exit $$rc
	$(MAKE) -j$(NPROC) fuzz FUZZ_SECONDS=$(CHECK_FUZZ_SECONDS)

bench: all $(BENCHES)
	BUILD=$(BUILD) BIN=$(BIN) scripts/run-bench.sh $(BENCHES) $(BENCH_PY)

run: deps
	$(MAKE) all
	BIN=$(BIN) scripts/run-demo.sh

deps:
	scripts/install-deps.sh

clean:
	rm -rf build build-asan build-fuzz bin

# ---- install ----------------------------------------------------------------
# GNU-style directories; DESTDIR stages a tree for packaging. The config goes
# to /etc/tokpipe whatever the prefix (that is where the units look), and an
# existing tokpipe.yaml is never overwritten: the new one lands next to it as
# tokpipe.yaml.dist. The systemd units are written from deploy/ with the
# install paths put into ExecStart=. `install` copies what `make` built in
# $(BIN) and builds nothing itself, so `sudo make install` leaves no
# root-owned build files behind.
PREFIX      ?= /usr/local
EXEC_PREFIX ?= $(PREFIX)
BINDIR      ?= $(EXEC_PREFIX)/bin
SYSCONFDIR  ?= /etc
DATAROOTDIR ?= $(PREFIX)/share
DOCDIR      ?= $(DATAROOTDIR)/doc/tokpipe
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
INSTALL     ?= install
INSTALL_PROGRAMS := tokpiped tokpipe-worker tokpipe tokpipe-http
UNITS       := $(notdir $(wildcard deploy/*.service deploy/*.target))
CONFDIR      = $(DESTDIR)$(SYSCONFDIR)/tokpipe
UNIT_SED    := -e 's|/usr/local/bin|$(BINDIR)|g' -e 's|/etc/tokpipe|$(SYSCONFDIR)/tokpipe|g' \
               -e 's|/usr/local/share/doc/tokpipe|$(DOCDIR)|g'

install:
	@for p in $(INSTALL_PROGRAMS); do [ -x $(BIN)/$$p ] || \
	  { echo "install: $(BIN)/$$p is missing: run make first" >&2; exit 1; }; done
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(CONFDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR) \
	  $(DESTDIR)$(SYSUSERSDIR)
	$(INSTALL) -m 0755 $(addprefix $(BIN)/,$(INSTALL_PROGRAMS)) $(DESTDIR)$(BINDIR)/
	@if [ -e $(CONFDIR)/tokpipe.yaml ]; then \
	  echo "$(CONFDIR)/tokpipe.yaml exists: kept; the shipped one is tokpipe.yaml.dist"; \
	  $(INSTALL) -m 0644 config/tokpipe.yaml $(CONFDIR)/tokpipe.yaml.dist; \
	else \
	  echo "$(INSTALL) -m 0644 config/tokpipe.yaml $(CONFDIR)/tokpipe.yaml"; \
	  $(INSTALL) -m 0644 config/tokpipe.yaml $(CONFDIR)/tokpipe.yaml; \
	fi
	@for u in $(UNITS); do \
	  echo "sed $(UNIT_SED) deploy/$$u > $(DESTDIR)$(UNITDIR)/$$u"; \
	  sed $(UNIT_SED) deploy/$$u > $(DESTDIR)$(UNITDIR)/$$u.tmp && chmod 0644 $(DESTDIR)$(UNITDIR)/$$u.tmp && \
	  mv $(DESTDIR)$(UNITDIR)/$$u.tmp $(DESTDIR)$(UNITDIR)/$$u || exit 1; done
	$(INSTALL) -m 0644 deploy/tokpipe.sysusers $(DESTDIR)$(SYSUSERSDIR)/tokpipe.conf
	$(INSTALL) -m 0644 protocol/PROTOCOL.md README.md $(DESTDIR)$(DOCDIR)/

# An edited config is the operator's: only an untouched copy is removed.
uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,$(INSTALL_PROGRAMS))
	rm -f $(addprefix $(DESTDIR)$(UNITDIR)/,$(UNITS)) $(DESTDIR)$(SYSUSERSDIR)/tokpipe.conf
	rm -f $(DESTDIR)$(DOCDIR)/PROTOCOL.md $(DESTDIR)$(DOCDIR)/README.md $(CONFDIR)/tokpipe.yaml.dist
	@if cmp -s config/tokpipe.yaml $(CONFDIR)/tokpipe.yaml; then rm -f $(CONFDIR)/tokpipe.yaml; \
	elif [ -e $(CONFDIR)/tokpipe.yaml ]; then echo "$(CONFDIR)/tokpipe.yaml was edited: kept"; fi
	-rmdir $(DESTDIR)$(DOCDIR) $(CONFDIR) 2>/dev/null || true

-include $(shell find $(BUILD) $(FUZZ_BUILD) -name '*.d' 2>/dev/null)

# The two commands of the quick start, and the few others a developer wants. Each does its own set-up:
# missing Debian packages are installed, CMake is configured, the build is brought up to date.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build build-asan build-tsan demo test test-release test-asan test-tsan bench plan-bench install clean \
        fuzz-deps build-fuzz fuzz

all: build

deps:
	@bash cmake/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

# The sanitized build generates a few buckets (every dtype but fp8_e5m2, whose layers then show the fallback
# and its reason, a chunked one, an odd head dim), not the release's 30 (gen/manifest.json's default): they are
# one template, and each costs ~10 s to compile with ASan.
# This, TSAN_BUCKETS and FUZZ_BUCKETS are per-build choices, so they live here, not in the manifest.
ASAN_BUCKETS ?= bf16:16,128:128:0 bf16:128:128:16 f16:16:64:0 f32:128:80:0 fp8_e4m3:16:64:0

# A build directory's bucket list is written to DIR/buckets.txt when it differs from the one there, so a list
# changed here or on the command line re-configures an existing build (CMake would keep the cached one).
%/buckets.txt: FORCE
	@mkdir -p $(@D) && printf '%s\n' '$(BUCKETS_OF_$*)' | cmp -s - $@ || printf '%s\n' '$(BUCKETS_OF_$*)' > $@
.PHONY: FORCE
FORCE:
BUCKETS_OF_$(ASAN_BUILD) = $(ASAN_BUCKETS)
BUCKETS_OF_$(TSAN_BUILD) = $(TSAN_BUCKETS)
BUCKETS_OF_$(FUZZ_BUILD) = $(FUZZ_BUCKETS)

$(ASAN_BUILD)/CMakeCache.txt: $(ASAN_BUILD)/buckets.txt | deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DUATTN_SANITIZE=ON \
	  -DUATTN_KERNEL_BUCKETS="$(ASAN_BUCKETS)" $(CMAKE_ARGS)

# The ThreadSanitizer build runs only the threaded suites (runtime, concurrent forwards), without Criterion,
# which cannot start under TSan (tests/common/standalone_test.h); its buckets are the ones those suites' layers use.
TSAN_BUCKETS ?= bf16:16:64,128:0 f32:16:128:0 f16:32:96:0

$(TSAN_BUILD)/CMakeCache.txt: $(TSAN_BUILD)/buckets.txt | deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUATTN_TSAN=ON -DUATTN_BUILD_PERF=OFF \
	  -DUATTN_KERNEL_BUCKETS="$(TSAN_BUCKETS)" $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)

build-tsan: deps $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS)

# The main job: a multi-step serving trace, planned step by step.
demo: build
	./$(BUILD)/perf/uattn-demo

# All tests: the optimized build, the same suites under ASan + UBSan, and the threaded ones under TSan.
test: test-release test-asan test-tsan

# The kernel suite's report of the ISA paths it ran and skipped on this CPU is printed after the run.
test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@cat $(BUILD)/isa_paths.txt 2>/dev/null || true

# Criterion forks each test; ASan's own SEGV handler would hide a crash test's signal (handle_segv=0).
test-asan: build-asan
	ASAN_OPTIONS=handle_segv=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# halt_on_error: the first race fails its test (exit 66) rather than scrolling past.
test-tsan: build-tsan
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS)

# The Python package: the extension module lands in $(BUILD)/python (PYTHONPATH=$(BUILD)/python /usr/bin/python3);
# `make test` runs its pytest suite through ctest.
.PHONY: python
python: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) --target uattn_python -j $(JOBS)

# The C sources as .clang-format says (make test checks it: ctest format_check).
.PHONY: format
format: deps
	bash tests/tools/format.sh --fix

# The attention on serving scenarios against this machine's limits (ARGS: its options, e.g. ARGS="--runs 9").
bench: build
	./$(BUILD)/perf/uattn-bench $(ARGS)

# The planner alone: one large serving step beside the numpy re-statement of the Gaudi planner.
plan-bench: build
	./$(BUILD)/perf/uattn-plan-bench $(ARGS)

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

# Coverage-guided fuzzing (tests/fuzz): clang's libFuzzer with ASan + UBSan, each target for FUZZ_SECONDS on
# a scratch copy of its committed corpus; fails on any finding. clang is installed here only, not for `test`.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
FUZZ_BUCKETS ?= bf16:16:128:0 fp8_e4m3:16:128:0

fuzz-deps:
	@bash cmake/install-deps.sh --fuzz

$(FUZZ_BUILD)/CMakeCache.txt: $(FUZZ_BUILD)/buckets.txt | fuzz-deps
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUATTN_FUZZ=ON -DUATTN_BUILD_TESTS=OFF \
	  -DUATTN_BUILD_PERF=OFF -DUATTN_KERNEL_BUCKETS="$(FUZZ_BUCKETS)" $(CMAKE_ARGS)

build-fuzz: fuzz-deps $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

fuzz: build-fuzz
	bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)

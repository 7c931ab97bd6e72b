# The two commands of the quick start, and the few others a developer wants. Each does its own set-up:
# missing Debian packages are installed, CMake is configured, the build is brought up to date.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build build-asan demo test test-release test-asan bench install clean

all: build

deps:
	@bash cmake/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

# The sanitized build generates a few buckets (every dtype, a chunked one, an odd head dim), not the
# release's 25: they are one template, and each costs ~10 s to compile with ASan.
ASAN_BUCKETS ?= bf16:16,128:128:0 bf16:128:128:16 f16:16:64:0 f32:128:80:0

$(ASAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DUATTN_SANITIZE=ON \
	  -DUATTN_KERNEL_BUCKETS="$(ASAN_BUCKETS)" $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# The main job: a multi-step serving trace, planned step by step.
demo: build
	./$(BUILD)/perf/uattn-demo

# All tests: the optimized build, then the same suites under ASan + UBSan.
test: test-release test-asan

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Criterion forks each test; ASan's own SEGV handler would hide a crash test's signal (shared/NOTES.md).
test-asan: build-asan
	ASAN_OPTIONS=handle_segv=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

bench: build
	./$(BUILD)/perf/uattn-plan-bench

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

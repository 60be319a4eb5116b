# offsim — the commands a user needs. On a fresh Debian 12 machine:
#   make run    install missing packages, build, run the default example (70B on 8×H100,
#               with and without host offload) and print the comparison
#   make test   same set-up, then the test suite (without GPU-labelled tests)
#   make bench  engine, sweep and GUI benchmarks (Release)
# PRESET selects the CMake preset: `ci` (Release, warnings as errors) by default, so that `make run`
# and `make test` share one build and CI runs exactly what a user runs.

PRESET ?= ci
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD := build/$(PRESET)
OFFSIM := $(BUILD)/scenarios/offsim
EXAMPLES := scenarios/examples

.PHONY: all deps configure build run test bench asan tsan format clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null || cmake --preset $(PRESET)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(OFFSIM) run $(EXAMPLES)/llama70b-8xh100-no-offload.yaml $(EXAMPLES)/llama70b-8xh100-offload.yaml

test: build
	ctest --preset $(PRESET) -j $(JOBS)

bench: deps
	@cmake --preset release >/dev/null
	cmake --build build/release -j $(JOBS)
	scripts/run-benchmarks.sh build/release

asan:
	$(MAKE) test PRESET=asan

# ThreadSanitizer: only the tests that start threads (label `threads`, tests/CMakeLists.txt) and
# the binaries they run are built and run.
tsan: deps
	@cmake --preset tsan >/dev/null || cmake --preset tsan
	cmake --build build/tsan -j $(JOBS) --target threaded_tests
	ctest --preset tsan -j $(JOBS)

format:
	git ls-files -- '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf build

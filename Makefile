# Tessera: the two commands are `make run` and `make test`.
BUILD_DIR ?= build
ASAN_DIR  ?= build-asan
JOBS      ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps configure build test test-asan run bench clean

all: build

deps:
	@bash scripts/deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: $(BUILD_DIR)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest -j $(JOBS) --output-on-failure --timeout 600

test-asan: deps
	cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DTESSERA_SANITIZE=ON -DTESSERA_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_DIR) -j $(JOBS)
	cd $(ASAN_DIR) && ctest -j $(JOBS) --output-on-failure --timeout 1200

run: build
	$(BUILD_DIR)/bin/tessera-bench demo

bench: build
	$(BUILD_DIR)/bin/tessera-bench topk --size 25600000 --density 0.001 --json
	for s in dense torus topk hitopk; do \
	  $(BUILD_DIR)/bin/tessera-bench exchange --strategy $$s --nodes 2 --local 2 --size 4000000 --density 0.001 --json; \
	done

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR)

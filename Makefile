# goep: two commands matter. `make run` runs the main job (ep-bench on the GPUs
# when there are any, else on the host backend); `make test` runs the tests.

GO        ?= go
DEVBIN    ?= .devbin
# What `make run` runs: an ep-bench command and its flags, e.g.
# make run BENCH_ARGS="collectives --sizes 1K,1M". Without a GPU, intranode
# runs the host backend with fewer timed calls (about a minute on 2 cores).
BENCH_ARGS ?= intranode
# Never NVLink multicast: it can take shared GPUs out of service.
export NCCL_NVLS_ENABLE := 0

# Packages whose test binaries hold GPU tests (they skip without a GPU).
GPU_TEST_PKGS := ./internal/cuda ./internal/device ./kernels ./routing ./bench ./channels ./intranode ./lowlatency ./ep ./buffer ./collectives ./collectives/plan/gpu ./collectives/plan/dsl ./internode

.PHONY: all build test vet run device-bin nccl-shim clean

all: build

build:
	$(GO) build ./...

vet:
	$(GO) vet ./...

# go vet + every test, race detector on. Kernels are compiled by NVRTC when it
# is installed (CI installs Debian's libnvrtc11.2 and sets GOEP_REQUIRE_NVRTC=1).
test: vet
	$(GO) test -race -count=1 -timeout 30m ./...

run:
	$(GO) run ./bench/cmd/ep-bench $(BENCH_ARGS)

# Binaries for a GPU machine that has no Go toolchain: ep-bench and the GPU
# test binaries, stripped, linux/amd64. scripts/device-run.sh runs them there.
device-bin:
	@mkdir -p $(DEVBIN)
	GOOS=linux GOARCH=amd64 CGO_ENABLED=1 $(GO) build -trimpath -ldflags='-s -w' -o $(DEVBIN)/ep-bench ./bench/cmd/ep-bench
	@for p in $(GPU_TEST_PKGS); do \
		n=$$(basename $$p); \
		GOOS=linux GOARCH=amd64 CGO_ENABLED=1 $(GO) test -c -trimpath -ldflags='-s -w' -o $(DEVBIN)/$$n.test $$p || exit 1; \
	done
	@ls -la $(DEVBIN)

# libgoep_nccl.so: the NCCL C API on goep, for LD_PRELOAD under NCCL programs
# (README: "The NCCL API from goep"). Stripped; about 5 MiB.
nccl-shim:
	@mkdir -p $(DEVBIN)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -ldflags='-s -w' -o $(DEVBIN)/libgoep_nccl.so ./ncclshim
	@rm -f $(DEVBIN)/libgoep_nccl.h
	@ls -la $(DEVBIN)/libgoep_nccl.so

clean:
	rm -rf $(DEVBIN)

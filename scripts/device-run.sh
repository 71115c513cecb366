#!/usr/bin/env bash
# Runs every GPU check, test binary and benchmark built by `make device-bin`
# on a GPU machine that has no Go toolchain. Logs go to $OUT (default ./out)
# as one archive; a short table is printed last.
#
#   scripts/device-run.sh [step ...]      steps: doctor launch cuda device kernels bench (default: all)
#
# The kernel cache lives in .devcache/ (GOEP_KERNEL_CACHE); its archive comes
# back as $OUT/kernel-cache.tgz so the next run can carry it and skip compiles.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
BIN=${BIN:-$PWD/.devbin}
LOGS=$(mktemp -d)
mkdir -p "$OUT" .devcache/kernels
export NCCL_NVLS_ENABLE=0 # never NVLink multicast
export GOEP_KERNEL_CACHE=$PWD/.devcache/kernels
[ -f .devcache/kernel-cache.tgz ] && tar -xzf .devcache/kernel-cache.tgz -C .devcache/kernels 2>/dev/null

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
STEPS=${*:-doctor launch cuda device kernels bench routing layout}
declare -a TABLE

step() { # name, command...
	local name=$1; shift
	local t0=$SECONDS
	echo "=== $name: $*" | tee -a "$LOGS/all.log"
	# A bound per step, so one hang cannot eat the whole lease.
	timeout -k 10 "${STEP_TIMEOUT:-300}" bash -c '"$@"' _ "$@" >"$LOGS/$name.log" 2>&1
	local rc=$?
	local skips fails
	skips=$(grep -c -- '--- SKIP' "$LOGS/$name.log")
	fails=$(grep -c -- '--- FAIL' "$LOGS/$name.log")
	TABLE+=("$(printf '%-16s rc=%-3s %4ss  fails=%s skips=%s' "$name" "$rc" $((SECONDS - t0)) "$fails" "$skips")")
	tail -n "${TAIL_LINES:-40}" "$LOGS/$name.log"
	# Logs so far, in case the whole call is cut off later.
	tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
	printf '%s\n' "${TABLE[@]}" >"$OUT/summary.txt"
}

gotest() { # package dir, binary, args...
	local dir=$1 bin=$2; shift 2
	(cd "$dir" && exec "$BIN/$bin" "$@")
}
export -f gotest
export BIN

{ nvidia-smi; nvidia-smi topo -m; } >"$LOGS/nvidia-smi.log" 2>&1
for s in $STEPS; do
	case $s in
	doctor) step doctor "$BIN/ep-bench" doctor --json "$LOGS/doctor.json" ;;
	launch) [ "$NGPU" -gt 1 ] && step launch "$BIN/ep-bench" launch -n "$NGPU" -- doctor --json "$LOGS/doctor-launch.json" ;;
	# Test binaries run in their package directory, as `go test` does.
	cuda) step cuda gotest internal/cuda cuda.test -test.v -test.count=1 -test.timeout=8m ;;
	device) step device gotest internal/device device.test -test.v -test.count=1 -test.timeout=8m ;;
	kernels) step kernels gotest kernels kernels.test -test.v -test.count=1 -test.timeout=8m ;;
	bench) step bench gotest internal/cuda cuda.test -test.run '^$' -test.bench . -test.benchtime=20000x ;;
	routing) step routing gotest routing routing.test -test.v -test.count=1 -test.timeout=8m ;;
	layout)
		step layout-bench gotest routing routing.test -test.run '^$' -test.bench BenchmarkLayoutKernel -test.benchtime 20000x
		step layout "$BIN/ep-bench" layout --tokens 128,512,4096,8192 --json "$LOGS/layout.json"
		;;
	channels) step channels gotest channels channels.test -test.v -test.count=1 -test.timeout=5m ;;
	semlab) [ "$NGPU" -gt 1 ] && GOEP_SEM_LAB=1 step semlab gotest channels channels.test -test.v -test.count=1 -test.run TestSemaphoreLatencyLab ;;
	channels-launch) [ "$NGPU" -gt 1 ] && step channels-launch "$BIN/ep-bench" launch -n "$NGPU" -- channels --check --sms 8,16,24,32,48,64,132 --json "$LOGS/channels.json" ;;
	port) step port gotest channels channels.test -test.v -test.count=1 -test.timeout=5m -test.run 'TestPort|TestHostSemaphore' ;;
	port-bench) [ "$NGPU" -gt 1 ] && step port-bench "$BIN/ep-bench" launch -n "$NGPU" -- channels --sizes 1M,16M,64M,256M --iters 20 --json "$LOGS/channels-bench.json" ;;
	# Plans whose world fits this machine, then our native allreduce of the
	# same shape (2 ranks) for the comparison.
	plan-bench)
		plans="allgather reduce reduce_pack sn_send_recv transfer_pack" # 2 GPUs
		[ "$NGPU" -ge 8 ] && plans="$plans allgather_pkt allreduce allreduce_pkt alltoall"
		for f in $plans; do
			step "plan-$f" "$BIN/ep-bench" plan --plan "collectives/plan/testdata/plans/$f.json" --backend cuda --size 64K,1M,32M
		done
		step native-allreduce-2 "$BIN/ep-bench" collectives --ranks 2 --colls allreduce,allgather --sizes 64K,1M,32M --json "$LOGS/native-2.json"
		;;
	plan-gpu) step plan-gpu gotest collectives/plan/gpu gpu.test -test.v -test.count=1 -test.timeout=8m ;;
	ep-repeat) step ep-repeat gotest ep ep.test -test.v -test.count=1 -test.timeout=9m -test.run TestRepeatedCallsGPU -ep.iters="${EP_ITERS:-1000}" ;;
	intranode) step intranode gotest intranode intranode.test -test.v -test.count=1 -test.timeout=9m ;;
	intranode-bench) step intranode-bench gotest intranode intranode.test -test.run '^$' -test.bench GPU -test.benchtime 50x ;;
	ep) step ep gotest ep ep.test -test.v -test.count=1 -test.timeout=9m -test.skip TestRepeatedCallsGPU ;;
	buffer) step buffer gotest buffer buffer.test -test.v -test.count=1 ;;
	ep-intranode)
		step ep-intranode "$BIN/ep-bench" launch -n "$NGPU" -- intranode --tokens 128,512,4096 --fp8 --json "$LOGS/intranode.json"
		step ep-intranode-16 "$BIN/ep-bench" launch -n "$NGPU" -- intranode --tokens 4096 --fp8 --sms 16 --json "$LOGS/intranode-16.json"
		;;
	# TUNE_RANKS: the group sizes to tune for (default: every GPU).
	ep-tune) for n in ${TUNE_RANKS:-$NGPU}; do
		step "ep-tune-$n" "$BIN/ep-bench" launch -n "$n" -- intranode --tokens 4096 --fp8 --tune --json "$LOGS/intranode-tune-$n.json"
	done ;;
	collectives) step collectives gotest collectives collectives.test -test.v -test.count=1 -test.timeout=9m ;;
	collectives-bench) step collectives-bench "$BIN/ep-bench" launch -n "$NGPU" -- collectives --compare nccl ${COLL_TUNE:+--tune --tune-out "$LOGS/coll-tuning.json"} --json "$LOGS/collectives.json" --plot "$LOGS/collectives" ;;
	epbench) step epbench gotest bench bench.test -test.v -test.count=1 -test.timeout=8m ;;
	dsl) step dsl gotest collectives/plan/dsl dsl.test -test.v -test.count=1 -test.run GPU -test.timeout=8m ;;
	# SHARED_RANKS goroutine ranks on the GPUs present (several to a GPU when
	# fewer): checks, and timings that are not NVLink figures.
	shared)
		step shared-intranode "$BIN/ep-bench" intranode --ranks "${SHARED_RANKS:-8}" --tokens 128,4096 --fp8 --json "$LOGS/shared-intranode.json"
		step shared-collectives "$BIN/ep-bench" collectives --ranks "${SHARED_RANKS:-8}" --sizes 4K,1M,16M --json "$LOGS/shared-collectives.json"
		step shared-channels "$BIN/ep-bench" channels --ranks "${SHARED_RANKS:-8}" --check --json "$LOGS/shared-channels.json"
		step shared-plan "$BIN/ep-bench" plan --plan collectives/plan/testdata/plans/allreduce_pkt.json --backend cuda --size 64K,1M
		;;
	# The NCCL-API shim under PyTorch (make nccl-shim): one rank per GPU
	# present, with and without the shim, then the comparison.
	torch-shim) step torch-shim python3 scripts/torch_shim_check.py --shim "$BIN/libgoep_nccl.so" ${TORCH_BENCH:+--bench} --out "$LOGS/torch-shim" ;;
	# A test pattern repeated: RUN_PKG RUN_BIN RUN_PATTERN RUN_COUNT.
	repeat) step "repeat-$RUN_BIN" gotest "$RUN_PKG" "$RUN_BIN" -test.v -test.count="${RUN_COUNT:-5}" -test.run "$RUN_PATTERN" -test.timeout=9m ;;
	*) echo "unknown step $s" ;;
	esac
done

tar -czf "$OUT/kernel-cache.tgz" -C .devcache/kernels . 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
printf '%s\n' "${TABLE[@]}" | tee "$OUT/summary.txt"

#!/usr/bin/env bash
# Work-queue runner for the GPU test binaries (built by `make device-bin`):
# every top-level test of every binary, spread over workers that each see
# some of the GPUs, so a 4-GPU machine runs four one-GPU suites at once.
#   scripts/gpu-jobs.sh SPEC...   one worker per SPEC, a CUDA_VISIBLE_DEVICES value ("0", "0,1", ...)
# e.g. `scripts/gpu-jobs.sh 0 1 2 3` (four one-GPU workers) or `scripts/gpu-jobs.sh 0,1 2,3` (two-GPU workers).
# Jobs come from $JOBS (default scripts/gpu-jobs.txt): lines "dir bin chunk [extra args...]": every top-level
# test of bin (run in dir), `chunk` tests to a job; "chunk@REGEX" keeps only the tests REGEX matches. Workers pull jobs until the queue is empty or $BUDGET seconds
# (default 540) have passed. Binaries may come as .devcache/devbin.tar.xz (xz keeps them under the carry limit).
# Everything comes back as $OUT/logs.tgz, $OUT/results.txt and two summaries (the device tool returns few files).
# The CPU emulation is switched off here (CXX): CI runs it.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/out}
export NCCL_NVLS_ENABLE=0 CXX=/nonexistent/g++ # no CPU emulation here: CI runs it
export GOEP_KERNEL_CACHE=$ROOT/.devcache/kernels
mkdir -p .devcache/kernels .devbin "$OUT/logs"
[ -f .devcache/kernel-cache.tgz ] && tar -xzf .devcache/kernel-cache.tgz -C .devcache/kernels 2>/dev/null
[ -f .devcache/devbin.tar.xz ] && tar -xJf .devcache/devbin.tar.xz -C .devbin
BIN=$ROOT/.devbin
START=$SECONDS
END=$((START + ${BUDGET:-540}))
Q=$(mktemp -d)
nvidia-smi -L > "$OUT/logs/gpus.txt" 2>&1
n=0
while read -r dir bin chunk extra; do
	[ -z "$dir" ] && continue
	case $dir in \#*) continue ;; esac
	filter='.*'
	case $chunk in *@*) filter=${chunk#*@}; chunk=${chunk%%@*} ;; esac
	mapfile -t tests < <(cd "$dir" && "$BIN/$bin" -test.list "$filter" 2>/dev/null | grep -E '^(Test|Example)')
	for ((i = 0; i < ${#tests[@]}; i += chunk)); do
		re=$(IFS='|'; echo "${tests[*]:i:chunk}")
		n=$((n + 1))
		printf '%s\n%s\n^(%s)$\n%s\n' "$dir" "$bin" "$re" "$extra" > "$Q/$(printf %04d $n)"
	done
done < "${JOBS:-scripts/gpu-jobs.txt}"
echo "queued $n jobs" | tee "$OUT/logs/queue.txt"
worker() {
	local gpus=$1
	for f in "$Q"/[0-9]*; do
		[ -e "$f" ] || continue
		mv "$f" "$f.$gpus" 2>/dev/null || continue
		local left=$((END - SECONDS))
		[ "$left" -lt 30 ] && { echo "SKIPPED-BUDGET $(sed -n 2,3p "$f.$gpus" | tr '\n' ' ')" >> "$OUT/results.txt"; continue; }
		mapfile -t j < "$f.$gpus"
		local name; name=$(basename "$f")-${j[1]%.test}
		local t0=$SECONDS
		(cd "${j[0]}" && CUDA_VISIBLE_DEVICES=$gpus timeout -k 5 "$left" "$BIN/${j[1]}" -test.v -test.count=1 -test.timeout=$((left + 60))s -test.run "${j[2]}" ${j[3]}) > "$OUT/logs/$name.log" 2>&1
		local rc=$?
		local p fl s
		p=$(grep -c -- '--- PASS' "$OUT/logs/$name.log"); fl=$(grep -c -- '--- FAIL' "$OUT/logs/$name.log"); s=$(grep -c -- '--- SKIP' "$OUT/logs/$name.log")
		printf '%-28s gpus=%-7s rc=%-3s %4ss pass=%-4s fail=%-3s skip=%-3s %s\n' "$name" "$gpus" "$rc" $((SECONDS - t0)) "$p" "$fl" "$s" "${j[2]:0:60}" >> "$OUT/results.txt"
	done
}
for spec in "$@"; do worker "$spec" & done
wait
tar -czf "$OUT/kernel-cache.tgz" -C .devcache/kernels . 2>/dev/null
(cd "$OUT/logs" && grep -h -B2 -A30 -e '--- FAIL' *.log > ../failures.txt 2>/dev/null
	grep -h -A2 -e '--- SKIP' *.log | grep -E '\.go:[0-9]+:' | sed 's/^ *//' | sort | uniq -c | sort -rn > ../skips.txt)
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "== failing or timed-out jobs"; grep -v 'rc=0 ' "$OUT/results.txt"
echo "== totals"; awk '{for(i=1;i<=NF;i++){if($i~/^pass=/){split($i,a,"=");p+=a[2]} if($i~/^fail=/){split($i,a,"=");f+=a[2]} if($i~/^skip=/){split($i,a,"=");s+=a[2]}}} END{print "jobs",NR,"pass",p,"fail",f,"skip",s}' "$OUT/results.txt"
echo "== skip reasons (top)"; head -15 "$OUT/skips.txt"
echo "elapsed $((SECONDS - START)) s"

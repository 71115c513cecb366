#!/usr/bin/env bash
# Mutation check of the CPU-emulated kernel tests (issue 12): applies one
# plausible one-line bug to each kernel source in turn, runs the emulated
# tests that cover it, expects them to FAIL, and restores the source.
# Prints one line per mutation; exits 1 if any mutation survived.
#
#   scripts/mutation-check.sh            # every mutation
#   scripts/mutation-check.sh plan_exec  # those whose name contains plan_exec
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

# name | file | exact text (must occur once) | replacement | package | -run pattern
mutations=(
  "layout-last-block|kernels/layout.cu|s_last = (arrived == gridDim.x - 1);|s_last = (arrived == gridDim.x - 2);|./routing|TestEmulatedLayout"
  "intranode-combine-weights|kernels/intranode.cu|acc += wv[i];|acc = wv[i];|./intranode|TestEmulatedKernels"
  "coll_ll-reduction|kernels/coll_ll.cu|          acc.add(x);|          acc.init(x);|./collectives|TestEmulatedKernelsMatchReference/2"
  "intranode-fingerprint|kernels/intranode.cuh|  return goep_in_sig_tag(d) == tag ? GOEP_IN_FP_SAME : GOEP_IN_FP_MISMATCH;|  return GOEP_IN_FP_SAME;|./intranode|TestEmulatedMismatchedCalls/entry-dtype"
  "coll_common-fingerprint|kernels/coll_common.cuh|  return theirs == mine ? GOEP_COLL_FP_SAME : GOEP_COLL_FP_MISMATCH;|  return GOEP_COLL_FP_SAME;|./collectives|TestEmulatedMismatchedCalls/^scratch$/^algorithm$"
  "coll_ll-fp-packet|kernels/coll_common.cuh|  if (theirs != fp) {|  if (false) {|./collectives|TestEmulatedMismatchedCalls/^ll$/^op$"
  "coll_bulk-sig-tag|kernels/coll_common.cuh|  return (d >> GOEP_COLL_SIG_SHIFT) == 0 ? GOEP_COLL_FP_SAME : GOEP_COLL_FP_MISMATCH;|  return GOEP_COLL_FP_SAME;|./collectives|TestEmulatedMismatchedCalls/^scratch$/^op$"
  "coll_bulk-zc-offset|kernels/coll_bulk.cu|srcs[q] = (q < W) ? s_in[q] + lo * E : nullptr;|srcs[q] = (q < W) ? s_in[q] + (lo + 1) * E : nullptr;|./collectives|TestEmulatedKernelsMatchReference/2"
  "channel-put-no-signal|kernels/channel_kernels.cu|      goep_mc_signal(ch);\n    }\n  }\n}|      (void)ch;\n    }\n  }\n}|./channels|TestEmulatedMemoryChannels"
  "port-put-offset|kernels/port_kernels.cu|goep_pc_put(tx, doff + h, soff + h, size - h, stage)|goep_pc_put(tx, doff + h, soff + h + 1, size - h, stage)|./channels|TestEmulatedPortChannels"
  "lowlatency-combine-sum|kernels/lowlatency.cu|acc0[x] = goep_ll_add(acc0[x], pv[x]);|acc0[x] = pv[x];|./lowlatency|TestEmulatedKernels/bf16-random"
  "lowlatency-combine-units|kernels/lowlatency.cu|  while (i >= s_tokbeg[r + 1]) {|  while (i > s_tokbeg[r + 1]) {|./lowlatency|TestEmulatedKernels/few-tokens"
  "lowlatency-port-rows|kernels/lowlatency.cu|  if (rows <= 0) {|  if (rows <= 1) {|./lowlatency|TestEmulatedNodes/2x2"
  "lowlatency-expert-parts|kernels/lowlatency.cu|              if (p % copies == part) {|              if (part == 0) {|./lowlatency|TestEmulatedKernels/one-rank"
  "lowlatency-scan-ranges|kernels/lowlatency.cu|          begin += s_cnt[s];|          begin += 0;|./lowlatency|TestEmulatedKernels/bf16-random"
  "lowlatency-tables-spread|kernels/lowlatency.cu|blockIdx.x) * 32 + lane; q < entries; q += stride) {|blockIdx.x) * 32; q < entries; q += stride) {|./lowlatency|TestEmulatedKernels/bf16-random"
  "lowlatency-copy-batch|kernels/lowlatency.cu|        for (int c0 = lane; c0 < nch; c0 += 8 * 32) {|        for (int c0 = lane; c0 < nch; c0 += 9 * 32) {|./lowlatency|TestEmulatedKernels/wide"
  "lowlatency-combine-send-batch|kernels/lowlatency.cu|              nb = q + 1;|              nb = 1;|./lowlatency|TestEmulatedKernels/bf16-random"
  "lowlatency-combine-prefetch|kernels/lowlatency.cu|      ok_n = un < units && goep_ll_comb_entry((int)un,|      ok_n = un < units && goep_ll_comb_entry((int)u,|./lowlatency|TestEmulatedKernels/bf16-random"
  "lowlatency-combine-two-rounds|kernels/lowlatency.cu|        const bool in0 = c0 < nchunks, in1 = rr + 1 < r_hi && c1 < nchunks;|        const bool in0 = c0 < nchunks, in1 = false;|./lowlatency|TestEmulatedKernels/wide"
  "lowlatency-combine-two-rounds-rm|kernels/lowlatency.cu|            b = goep_in_ld_nc_v4(y + (u64)i * row2 + (u64)c1 * 16);|            b = goep_in_ld_nc_v4(y + (u64)i * row2 + (u64)c0 * 16);|./lowlatency|TestEmulatedKernels/wide-rank-major"
  "lowlatency-combine-two-rounds-fp8|kernels/lowlatency.cu|                v1[q] = goep_ll_y_chunk(y, y_scales, y_fp8, pq[q], hidden, ns, c1, &sc1[q]);|                v1[q] = goep_ll_y_chunk(y, y_scales, y_fp8, pq[q], hidden, ns, c0, &sc1[q]);|./lowlatency|TestEmulatedKernels/wide-fp8"
  "lowlatency-dispatch-send-prefetch|kernels/lowlatency.cu|          vn = goep_in_ld_nc_v4(src + (u64)(c + 32) * 16);|          vn = goep_in_ld_nc_v4(src + (u64)(c + 64) * 16);|./lowlatency|TestEmulatedKernels/wide"
  "lowlatency-finish-last|kernels/lowlatency.cu|    if (atomicAdd(done, 1u) == gridDim.x - 1) {\n      *s_last = 1;\n      goep_fence_acq_rel_gpu();|    if (atomicAdd(done, 1u) == gridDim.x) {\n      *s_last = 1;\n      goep_fence_acq_rel_gpu();|./lowlatency|TestEmulatedKernels/bf16-random"
  "lowlatency-combine-recv-two-rounds|kernels/lowlatency.cu|      const bool in1 = rr + 1 < r_hi && c1 < nchunks;  // implies c0 < nchunks|      const bool in1 = false;|./lowlatency|TestEmulatedKernels/wide"
  "plan_exec-reduction|kernels/plan_exec.cu|  if (op == GOEP_PLAN_MAX) return b > a ? b : a;\n  return a + b;|  if (op == GOEP_PLAN_MAX) return b > a ? b : a;\n  return a;|./collectives/plan/gpu|TestEmulatedShippedPlans"
)

survived=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file from to pkg run <<<"$m"
  if [ $# -gt 0 ] && [[ "$name" != *"$1"* ]]; then continue; fi
  backup=$(mktemp)
  cp "$file" "$backup"
  if ! python3 - "$file" "$from" "$to" <<'PY'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
s = open(path).read()
if s.count(old) != 1:
    sys.exit(f"{path}: the text to mutate occurs {s.count(old)} times, want 1: {old!r}")
open(path, "w").write(s.replace(old, new))
PY
  then
    echo "ERROR    $name: cannot apply (the source changed: update scripts/mutation-check.sh)"
    survived=1
    rm -f "$backup"
    continue
  fi
  start=$(date +%s)
  out=$(timeout 900 go test -count=1 -run "$run" "$pkg" 2>&1)
  rc=$?
  cp "$backup" "$file"
  rm -f "$backup"
  took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    echo "SURVIVED $name ($file): go test -run '$run' $pkg passed (${took}s)"
    survived=1
  elif printf '%s\n' "$out" | grep -q 'cpuemu: building'; then
    echo "ERROR    $name ($file): the mutated source does not compile"
    survived=1
  else
    first=$(printf '%s\n' "$out" | grep -m1 -E -- '--- FAIL' || true)
    why=$(printf '%s\n' "$out" | grep -m1 -A1 -E 'Error:' | tail -1 | sed -E 's/^[[:space:]]+//' | cut -c1-200)
    echo "KILLED   $name ($file): go test -run '$run' $pkg failed (${took}s): ${first# } ${why}"
  fi
done
exit $survived

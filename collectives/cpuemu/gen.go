//go:build ignore

// gen writes kernels_gen.h: the CUDA sources of the collective kernels and
// the headers they include, as C++ that g++ compiles for the CPU emulator
// (emu.go). Includes are dropped; every function whose body holds inline
// PTX is replaced by the emulation in `emulations` below (a helper missing
// there fails generation, so a new one cannot slip through unemulated);
// __shared__ declarations become per-block storage (shim.h). Run from this
// directory: go run gen.go [-check].
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

var files = []string{
	"common.cuh", "channel_abi.cuh", "channel_wait.cuh", "channel_copy.cuh", "packet_device.cuh",
	"sem_device.cuh", "channel_device.cuh", "coll_common.cuh", "coll_ll.cu", "coll_bulk.cu", "coll_util.cu",
}

// emulations replace the PTX helpers, keyed by the name before "(".
var emulations = map[string]string{
	"goep_globaltimer":             `inline u64 goep_globaltimer() { return emu_now_ns(); }`,
	"goep_ld_acquire_gpu_u32":      `inline u32 goep_ld_acquire_gpu_u32(const u32* p) { emu_yield(); return __atomic_load_n(p, __ATOMIC_ACQUIRE); }`,
	"goep_ld_acquire_gpu_u64":      `inline u64 goep_ld_acquire_gpu_u64(const u64* p) { emu_yield(); return __atomic_load_n(p, __ATOMIC_ACQUIRE); }`,
	"goep_ld_acquire_sys_u32":      `inline u32 goep_ld_acquire_sys_u32(const u32* p) { emu_yield(); return __atomic_load_n(p, __ATOMIC_ACQUIRE); }`,
	"goep_ld_acquire_sys_u64":      `inline u64 goep_ld_acquire_sys_u64(const u64* p) { emu_yield(); return __atomic_load_n(p, __ATOMIC_ACQUIRE); }`,
	"goep_ld_relaxed_sys_u32":      `inline u32 goep_ld_relaxed_sys_u32(const u32* p) { emu_yield(); return __atomic_load_n(p, __ATOMIC_RELAXED); }`,
	"goep_st_release_gpu_u32":      `inline void goep_st_release_gpu_u32(u32* p, u32 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }`,
	"goep_st_release_gpu_u64":      `inline void goep_st_release_gpu_u64(u64* p, u64 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }`,
	"goep_st_release_sys_u32":      `inline void goep_st_release_sys_u32(u32* p, u32 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }`,
	"goep_st_release_sys_u64":      `inline void goep_st_release_sys_u64(u64* p, u64 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }`,
	"goep_st_relaxed_sys_u32":      `inline void goep_st_relaxed_sys_u32(u32* p, u32 v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }`,
	"goep_fence_acq_rel_gpu":       `inline void goep_fence_acq_rel_gpu() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }`,
	"goep_fence_acq_rel_sys":       `inline void goep_fence_acq_rel_sys() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }`,
	"goep_chan_ld_relaxed_sys_u64": `inline u64 goep_chan_ld_relaxed_sys_u64(const u64* p) { emu_yield(); return __atomic_load_n(p, __ATOMIC_RELAXED); }`,
	"goep_copy_ld<goep_u128>": `template <>
inline goep_u128 goep_copy_ld<goep_u128>(const goep_u128* p) { goep_u128 v; memcpy(&v, (const void*)p, 16); return v; }`,
	"goep_copy_st<goep_u128>": `template <>
inline void goep_copy_st<goep_u128>(goep_u128* p, const goep_u128& v) { memcpy((void*)p, &v, 16); }`,
	"goep_ll_flag_end": `inline void goep_ll_flag_end(goep_ll_flag* f, u32 flag) {
  __syncthreads();
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
  const u32 blocks = gridDim.x * gridDim.y * gridDim.z;
  if (blocks == 1) { __atomic_store_n(&f->value, flag, __ATOMIC_RELEASE); return; }
  const u32 prev = __atomic_fetch_add(&f->arrived, 1u, __ATOMIC_ACQ_REL);
  if (prev == blocks - 1) { f->arrived = 0; __atomic_store_n(&f->value, flag, __ATOMIC_RELEASE); }
}`,
	"goep_ll16_store": `inline void goep_ll16_store(goep_ll16* p, u32 d1, u32 d2, u32 flag) {
  __atomic_store_n((u64*)p, (u64)d1 | ((u64)flag << 32), __ATOMIC_RELAXED);
  __atomic_store_n((u64*)p + 1, (u64)d2 | ((u64)flag << 32), __ATOMIC_RELAXED);
}`,
	"goep_ll8_store": `inline void goep_ll8_store(goep_ll8* p, u32 d, u32 flag) {
  __atomic_store_n((u64*)p, (u64)d | ((u64)flag << 32), __ATOMIC_RELAXED);
}`,
	"goep_ll16_try": `inline bool goep_ll16_try(const goep_ll16* p, u32 flag, u32& d1, u32& d2, u32& seen) {
  emu_yield();
  const u64 a = __atomic_load_n((const u64*)p, __ATOMIC_RELAXED), b = __atomic_load_n((const u64*)p + 1, __ATOMIC_RELAXED);
  d1 = (u32)a; d2 = (u32)b;
  const u32 f1 = (u32)(a >> 32), f2 = (u32)(b >> 32);
  seen = (f1 != flag) ? f1 : f2;
  return f1 == flag && f2 == flag;
}`,
	"goep_ll8_try": `inline bool goep_ll8_try(const goep_ll8* p, u32 flag, u32& d, u32& seen) {
  emu_yield();
  const u64 a = __atomic_load_n((const u64*)p, __ATOMIC_RELAXED);
  d = (u32)a; seen = (u32)(a >> 32);
  return seen == flag;
}`,
	"goep_coll_ld_cg":         `inline goep_u128 goep_coll_ld_cg(const goep_u128* p) { goep_u128 v; memcpy(&v, (const void*)p, 16); return v; }`,
	"goep_sem_signal":         `inline void goep_sem_signal(const goep_semaphore& s) { __atomic_fetch_add(s.remote, 1ull, __ATOMIC_RELEASE); }`,
	"goep_sem_relaxed_signal": `inline void goep_sem_relaxed_signal(const goep_semaphore& s) { __atomic_fetch_add(s.remote, 1ull, __ATOMIC_RELAXED); }`,
}

var (
	fnStartRE = regexp.MustCompile(`(?m)^(?:template <>\n)?__device__ (?:__forceinline__|__noinline__) `)
	includeRE = regexp.MustCompile(`#include "[^"]+"`)
	sharedRE  = regexp.MustCompile(`__shared__ ([\w\s\*]+?)\s*(\w+)((?:\[[^\]]+\])*);`)
)

// replacePTX swaps every function definition whose body uses asm for its
// emulation.
func replacePTX(src string, used map[string]bool) (string, error) {
	var b strings.Builder
	i := 0
	for {
		m := fnStartRE.FindStringIndex(src[i:])
		if m == nil {
			b.WriteString(src[i:])
			return b.String(), nil
		}
		start := i + m[0]
		open := strings.IndexByte(src[start:], '(')
		if open < 0 {
			b.WriteString(src[i:])
			return b.String(), nil
		}
		open += start
		head := strings.Fields(src[start:open])
		name := head[len(head)-1]
		k, depth := open+1, 1
		for depth > 0 {
			switch src[k] {
			case '(':
				depth++
			case ')':
				depth--
			}
			k++
		}
		rest := strings.TrimLeft(src[k:], " \t\n")
		if !strings.HasPrefix(rest, "{") { // a declaration
			b.WriteString(src[i:k])
			i = k
			continue
		}
		body := len(src) - len(rest)
		e, depth := body, 0
		for {
			if src[e] == '{' {
				depth++
			} else if src[e] == '}' {
				depth--
				if depth == 0 {
					break
				}
			}
			e++
		}
		if strings.Contains(src[body:e+1], "asm") {
			emu, ok := emulations[name]
			if !ok {
				return "", fmt.Errorf("%s uses inline PTX and gen.go has no emulation for it", name)
			}
			used[name] = true
			b.WriteString(src[i:start])
			b.WriteString("/* " + name + ": emulated */\n" + emu)
		} else {
			b.WriteString(src[i : e+1])
		}
		i = e + 1
	}
}

func generate() (string, error) {
	used := map[string]bool{}
	var out strings.Builder
	out.WriteString("// Code generated by gen.go from ../../kernels; DO NOT EDIT.\n")
	for _, f := range files {
		raw, err := os.ReadFile("../../kernels/" + f)
		if err != nil {
			return "", err
		}
		s := includeRE.ReplaceAllString(string(raw), "")
		if s, err = replacePTX(s, used); err != nil {
			return "", fmt.Errorf("%s: %w", f, err)
		}
		s = sharedRE.ReplaceAllStringFunc(s, func(m string) string {
			g := sharedRE.FindStringSubmatch(m)
			t := strings.TrimSpace(g[1])
			if g[3] != "" {
				return fmt.Sprintf("%s (&%s)%s = *emu_shared<%s%s>();", t, g[2], g[3], t, g[3])
			}
			return fmt.Sprintf("%s& %s = *emu_shared<%s>();", t, g[2], t)
		})
		fmt.Fprintf(&out, "// ---- %s\n%s\n", f, s)
	}
	var unused []string
	for n := range emulations {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		return "", fmt.Errorf("emulations of helpers the sources no longer define: %v", unused)
	}
	return out.String(), nil
}

func main() {
	check := flag.Bool("check", false, "exit 1 if kernels_gen.h is not what gen.go would write")
	flag.Parse()
	s, err := generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	if *check {
		old, _ := os.ReadFile("kernels_gen.h")
		if string(old) != s {
			fmt.Fprintln(os.Stderr, "gen: kernels_gen.h is stale: run `go run gen.go` in collectives/cpuemu")
			os.Exit(1)
		}
		return
	}
	if err := os.WriteFile("kernels_gen.h", []byte(s), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

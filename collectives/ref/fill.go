package ref

import (
	"runtime"
	"sync"

	"github.com/goep-dev/goep/kernels"
)

// Fill is a kind of generated test data. Element i of rank r's buffer is a
// function of (seed, r, i) only, computed the same way here and on the
// device (goep_coll_fill_value), so any rank, the host or a kernel can
// produce any element of any rank's input without moving data.
type Fill uint32

const (
	// FillRandom: pseudo-random values in [-4, 4) with full float32
	// precision before rounding to the type (raw non-NaN bytes for FP8), so
	// rounding and the order of a sum matter.
	FillRandom Fill = 0
	// FillSmallInt: integers in [-8, 8]. Sums of up to 2^7 of them are exact
	// in every type and every order, so any correct algorithm (NCCL's too)
	// gives exactly the reference.
	FillSmallInt Fill = 1
)

func (f Fill) String() string {
	if f == FillSmallInt {
		return "small-int"
	}
	return "random"
}

// RankSeed is the pattern seed of rank's data under seed.
func RankSeed(seed uint32, rank int) uint32 { return seed ^ uint32(rank+1)*0x9e3779b9 }

// FillElem is element i of rank's generated buffer.
func FillElem(d DataType, f Fill, seed uint32, rank int, i uint64) uint32 {
	h := kernels.PatternValue(i, RankSeed(seed, rank))
	if f == FillSmallInt {
		return FromFloat32(d, float32(int32(h%17)-8))
	}
	if d == FP8E4M3 {
		b := h & 0xff
		if b&0x7f == 0x7f { // NaN: keep data NaN-free
			b ^= 1
		}
		return b
	}
	return FromFloat32(d, float32(int32(h>>8)-(1<<23))*0x1p-21)
}

// FillBuffer writes elements [first, first+len(buf)/size) of rank's
// generated buffer into buf.
func FillBuffer(buf []byte, d DataType, f Fill, seed uint32, rank int, first uint64) {
	n := len(buf) / d.Size()
	parallel(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			SetElem(buf, d, i, FillElem(d, f, seed, rank, first+uint64(i)))
		}
	})
}

// ExpectedAllReduce is element i of every rank's allreduce output.
func ExpectedAllReduce(d DataType, op Op, f Fill, seed uint32, world int, i uint64) uint32 {
	var vals [64]uint32
	for r := 0; r < world; r++ {
		vals[r] = FillElem(d, f, seed, r, i)
	}
	return Reduce(d, op, vals[:world])
}

// ExpectedAllGather is element i of every rank's allgather output, each
// rank sending count elements.
func ExpectedAllGather(d DataType, f Fill, seed uint32, count, i uint64) uint32 {
	return FillElem(d, f, seed, int(i/count), i%count)
}

// ExpectedReduceScatter is element i of rank's reduce-scatter output, each
// rank receiving count elements (inputs hold world*count).
func ExpectedReduceScatter(d DataType, op Op, f Fill, seed uint32, world, rank int, count, i uint64) uint32 {
	return ExpectedAllReduce(d, op, f, seed, world, uint64(rank)*count+i)
}

// Mismatch is the first wrong element a comparison found.
type Mismatch struct {
	Count      int    // wrong elements
	Index      int    // the first one
	Got, Want  uint32 // its bits
	CheckedAll bool   // every element was compared (else a sample)
}

// Compare checks got (elements of type d) against want(i) for every i, in
// parallel; nil when all match.
func Compare(got []byte, d DataType, want func(i uint64) uint32) *Mismatch {
	n := len(got) / d.Size()
	var mu sync.Mutex
	var m *Mismatch
	parallel(n, func(lo, hi int) {
		bad, first := 0, -1
		var g, w uint32
		for i := lo; i < hi; i++ {
			x, y := Elem(got, d, i), want(uint64(i))
			if x != y {
				if first < 0 {
					first, g, w = i, x, y
				}
				bad++
			}
		}
		if bad == 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if m == nil {
			m = &Mismatch{Index: first, Got: g, Want: w, CheckedAll: true}
		} else if first < m.Index {
			m.Index, m.Got, m.Want = first, g, w
		}
		m.Count += bad
	})
	return m
}

// parallel runs fn over [0, n) in chunks on every CPU (one call below 64K).
func parallel(n int, fn func(lo, hi int)) {
	const grain = 1 << 16
	if n <= grain {
		fn(0, n)
		return
	}
	workers := min(runtime.GOMAXPROCS(0), (n+grain-1)/grain)
	var wg sync.WaitGroup
	step := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += step {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, min(lo+step, n))
	}
	wg.Wait()
}

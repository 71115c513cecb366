package abi

// Call fingerprints (kernels/coll_common.cuh): a 64-bit word per launch,
// the low FPSeqBits the launch's sequence number (the kernel adds them),
// the rest the call's shape, packed by the launcher with Shape.
const (
	FPSeqBits    = 12
	FPSeqMask    = 1<<FPSeqBits - 1
	fpKindShift  = 12 // 2 bits: kind + 1 (never 0, so no fingerprint is 0)
	fpDTypeShift = 14 // 3 bits: dtype.DType & 7 (BF16 1, FP8E4M3 2, FP32 3, FP16 7)
	fpOpShift    = 17 // 3 bits: ref.Op
	fpAlgoShift  = 20 // 3 bits: FPAlgo*
	fpGridShift  = 23 // 10 bits: the grid of a bulk kernel mod 1024 (0 for LL kernels: their grids may differ)
	fpCountShift = 33 // 31 bits: FoldCount(count)
	FPCountBits  = 31
)

// Algorithm codes in a fingerprint.
const (
	FPAlgoLL      = 1
	FPAlgoLL2     = 2
	FPAlgoScratch = 3
	FPAlgoZC      = 4
	FPAlgoNone    = 5 // a call of count 0 (goep_coll_fp_sync)
)

// FoldCount folds an element count into FPCountBits bits: counts below
// 2^31 are kept exactly; larger ones (beyond 4 GiB of bf16) have their high
// bits multiplied by an odd constant and XORed in, so powers of two and
// nearby sizes stay apart (a plain modulus would make 2^31 and 2^32 equal),
// and a collision takes a contrived pair of counts.
func FoldCount(n uint64) uint64 {
	const m = 1<<FPCountBits - 1
	return (n ^ (n>>FPCountBits)*0x9e3779b97f4a7c15>>17) & m
}

// Shape packs a call's shape (sequence bits zero). grid is the bulk
// kernel's grid (0 for LL kernels and count-0 calls).
func Shape(kind, dtype, op, algo uint32, grid int, count uint64) uint64 {
	return uint64(kind+1)&3<<fpKindShift | uint64(dtype)&7<<fpDTypeShift | uint64(op)&7<<fpOpShift |
		uint64(algo)&7<<fpAlgoShift | uint64(grid)&1023<<fpGridShift | FoldCount(count)<<fpCountShift
}

// Fingerprint is a decoded fingerprint word.
type Fingerprint struct {
	Seq   uint32 // mod 2^FPSeqBits
	Kind  int    // KindAllReduce..; -1 when no call was fingerprinted yet
	DType uint32
	Op    uint32
	Algo  uint32
	Grid  uint32
	Count uint64 // FoldCount of the count
}

// DecodeFingerprint unpacks a word.
func DecodeFingerprint(w uint64) Fingerprint {
	return Fingerprint{
		Seq: uint32(w & FPSeqMask), Kind: int(w>>fpKindShift&3) - 1, DType: uint32(w >> fpDTypeShift & 7),
		Op: uint32(w >> fpOpShift & 7), Algo: uint32(w >> fpAlgoShift & 7), Grid: uint32(w >> fpGridShift & 1023),
		Count: w >> fpCountShift,
	}
}

package abi_test

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/nvrtc"
	"github.com/goep-dev/goep/kernels"
)

// The Go layout of goep_coll_ctx and the constants the launchers and twins
// share with coll_common.cuh are compiled, as static_asserts, against the
// header.
func TestABIMatchesHeader(t *testing.T) {
	if _, err := nvrtc.Load(); err != nil {
		if os.Getenv("GOEP_REQUIRE_NVRTC") == "1" {
			t.Fatalf("GOEP_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: %v", err)
		}
		t.Skipf("NVRTC not available: %v", err)
	}
	consts := map[string]int{
		"GOEP_COLL_MAX_RANKS": abi.MaxRanks, "GOEP_COLL_MAX_THREADS": abi.KernelMaxThreads,
		"GOEP_COLL_DESC_SIZE": abi.DescSize, "sizeof(goep_coll_ctx)": abi.CtxSize,
		"GOEP_COLL_STAGE_ENTRY": abi.StageEntry, "GOEP_COLL_STAGE_RS_DATA": abi.StageRSData,
		"GOEP_COLL_STAGE_AG_DATA": abi.StageAGData, "GOEP_COLL_STAGE_EXIT": abi.StageExit,
		"GOEP_COLL_STAGE_LL1": abi.StageLL1, "GOEP_COLL_STAGE_LL2": abi.StageLL2,
		"GOEP_COLL_STAGE_MISMATCH": abi.StageMismatch, "GOEP_COLL_STAGE_FP": abi.StageFP,
		"GOEP_COLL_CTRL_FP": abi.CtrlFP, "GOEP_COLL_CTRL_PUB": abi.CtrlPub,
		"GOEP_COLL_CTRL_BYTES": abi.CtrlBytes, "GOEP_COLL_FP_SEQ_MASK": abi.FPSeqMask,
		"GOEP_COLL_KIND_ALLREDUCE": abi.KindAllReduce, "GOEP_COLL_KIND_ALLGATHER": abi.KindAllGather,
		"GOEP_COLL_KIND_REDUCESCATTER": abi.KindReduceScatter,
		"GOEP_COLL_BF16":               int(ref.BF16), "GOEP_COLL_FP16": int(ref.FP16), "GOEP_COLL_FP32": int(ref.FP32),
		"GOEP_COLL_FP8E4M3": int(ref.FP8E4M3), "GOEP_COLL_SUM": int(ref.Sum), "GOEP_COLL_MIN": int(ref.Min),
		"GOEP_COLL_MAX": int(ref.Max), "GOEP_COLL_FILL_RANDOM": int(ref.FillRandom),
		"GOEP_COLL_FILL_SMALLINT": int(ref.FillSmallInt),
	}
	offsets := map[string]int{
		"rank": abi.CtxRank, "world": abi.CtxWorld, "sem_blocks": abi.CtxSemBlocks, "max_regs": abi.CtxMaxRegs,
		"flag": abi.CtxFlag, "wd": abi.CtxWatchdog, "sems": abi.CtxSems, "regs": abi.CtxRegs,
		"packet_half": abi.CtxPacketHalf, "scratch_size": abi.CtxScratchSize, "packets": abi.CtxPackets,
		"scratch": abi.CtxScratch, "mailbox": abi.CtxMailbox, "ll_id": abi.CtxLLID, "ctrl": abi.CtxCtrl,
		"seq": abi.CtxSeq, "failed": abi.CtxFailed, "arrived": abi.CtxArrived, "self": abi.CtxSelf,
	}
	var b strings.Builder
	b.WriteString("#include \"coll_common.cuh\"\n")
	for name, v := range consts {
		fmt.Fprintf(&b, "static_assert((u64)(%s) == %dull, \"Go: %s = %d\");\n", name, v, name, v)
	}
	for f, v := range offsets {
		fmt.Fprintf(&b, "static_assert(GOEP_OFFSETOF(goep_coll_ctx, %s) == %d, \"Go: offset of %s = %d\");\n", f, v, f, v)
	}
	b.WriteString("extern \"C\" __global__ void goep_coll_abi_probe() {}\n")
	c := kernels.NewCompiler(kernels.Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	_, err := c.CompileSource("coll_abi_probe", b.String(), kernels.SM90)
	require.NoError(t, err)
}

func TestCtxRoundTrip(t *testing.T) {
	x := abi.Ctx{Rank: 3, World: 8, SemBlocks: 64, MaxRegs: 256, Flag: 0x1000, Watchdog: 0x2000, Sems: 0x3000,
		Regs: 0x4000, PacketHalf: 16 << 20, ScratchSize: 64 << 20, Seq: 1<<40 + 5, Failed: 1, Arrived: 9, Self: 0x5000}
	for i := range x.Packets {
		x.Packets[i], x.Scratch[i], x.Mailbox[i], x.LLID[i] = uintptr(0x10000*i+1), uintptr(0x20000*i+2), uintptr(0x30000*i+3), uint32(i+7)
		x.Ctrl[i] = uintptr(0x40000*i + 4)
	}
	b := make([]byte, abi.CtxSize)
	x.Encode(b)
	require.Equal(t, x, abi.DecodeCtx(b))
}

func TestPlanRounds(t *testing.T) {
	// 1000 elements over 3 parts of cells of 64 (vectors of 8): 5 full
	// rounds of 192, then 40 left: cells of 16.
	r := abi.PlanRounds(1000, 3, 64, 8)
	require.Equal(t, abi.Rounds{Cell: 64, LastCell: 16, Full: 5, Total: 6}, r)
	covered := uint64(0)
	for k := uint64(0); k < r.Total; k++ {
		covered += 3 * r.CellOf(k)
	}
	require.GreaterOrEqual(t, covered, uint64(1000))
	require.Equal(t, abi.Rounds{Cell: 64, Full: 1, Total: 1}, abi.PlanRounds(192, 3, 64, 8))
	require.Equal(t, abi.Rounds{Cell: 64, LastCell: 8, Total: 1}, abi.PlanRounds(1, 3, 64, 8))
}

// Every field of a shape survives packing, the sequence bits stay free,
// and the count folds exactly below 2^31 and keeps powers of two apart
// above.
func TestFingerprintShape(t *testing.T) {
	w := abi.Shape(abi.KindReduceScatter, 7, 2, abi.FPAlgoZC, 1023, 123456789)
	require.Zero(t, w&abi.FPSeqMask)
	f := abi.DecodeFingerprint(w | 0xabc)
	require.Equal(t, abi.Fingerprint{Seq: 0xabc, Kind: abi.KindReduceScatter, DType: 7, Op: 2, Algo: abi.FPAlgoZC,
		Grid: 1023, Count: 123456789}, f)
	require.Equal(t, -1, abi.DecodeFingerprint(0).Kind)
	seen := map[uint64]uint64{}
	for k := uint(0); k <= 50; k++ {
		for _, n := range []uint64{1 << k, 1<<k + 1, 3 << k} {
			fc := abi.FoldCount(n)
			require.Less(t, fc, uint64(1)<<abi.FPCountBits)
			if n < 1<<abi.FPCountBits {
				require.Equal(t, n, fc)
			}
			if m, ok := seen[fc]; ok && m != n {
				t.Errorf("counts %d and %d fold to the same %d", m, n, fc)
			}
			seen[fc] = n
		}
	}
}

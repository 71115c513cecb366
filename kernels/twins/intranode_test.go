package twins_test

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/nvrtc"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/kernels"
)

// The Go mirror of intranode.cuh's constants (used by the launchers and by
// the twins) is compiled, as static_asserts, against the header.
func TestIntranodeConstantsMatchHeader(t *testing.T) {
	if _, err := nvrtc.Load(); err != nil {
		if os.Getenv("GOEP_REQUIRE_NVRTC") == "1" {
			t.Fatalf("GOEP_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: %v", err)
		}
		t.Skipf("NVRTC not available: %v", err)
	}
	consts := map[string]int{
		"GOEP_IN_MAX_RANKS": intranode.MaxRanks, "GOEP_IN_MAX_TOPK": intranode.MaxTopK,
		"GOEP_IN_MAX_EXPERTS":          intranode.MaxExperts,
		"GOEP_IN_NOTIFY_MAX_THREADS":   intranode.NotifyMaxThreads,
		"GOEP_IN_DISPATCH_MAX_THREADS": intranode.DispatchMaxThreads,
		"GOEP_IN_COMBINE_MAX_THREADS":  intranode.CombineMaxThreads,
		"GOEP_IN_KIND_NOTIFY":          intranode.KindNotify, "GOEP_IN_KIND_DISPATCH": intranode.KindDispatch,
		"GOEP_IN_KIND_COMBINE": intranode.KindCombine,
		"GOEP_IN_CTRL_EPOCH":   intranode.CtrlEpoch, "GOEP_IN_CTRL_ARRIVE": intranode.CtrlArrive,
		"GOEP_IN_CTRL_ENTERED": intranode.CtrlEntered, "GOEP_IN_CTRL_KIND_STRIDE": intranode.CtrlKindStride,
		"GOEP_IN_CTRL_BYTES": intranode.CtrlBytes, "GOEP_IN_ARRIVAL_UNIT": intranode.ArrivalUnit,
		"GOEP_IN_STAGE_NOTIFY_BARRIER":   intranode.StageNotifyBarrier,
		"GOEP_IN_STAGE_DISPATCH_ENTRY":   intranode.StageDispatchEntry,
		"GOEP_IN_STAGE_DISPATCH_ARRIVAL": intranode.StageDispatchArrival,
		"GOEP_IN_STAGE_COMBINE_ENTRY":    intranode.StageCombineEntry,
		"GOEP_IN_STAGE_COMBINE_ARRIVAL":  intranode.StageCombineArrival,
	}
	var b strings.Builder
	b.WriteString("#include \"intranode.cuh\"\n")
	for name, v := range consts {
		fmt.Fprintf(&b, "static_assert((u64)(%s) == %dull, \"Go: %s = %d\");\n", name, v, name, v)
	}
	// The offset helpers agree with the Go ones.
	fmt.Fprintf(&b, "static_assert(GOEP_IN_CTRL_ARRIVE + %d * GOEP_IN_CTRL_KIND_STRIDE + 8 * 5 == %d, \"arrive\");\n",
		intranode.KindCombine, intranode.ArriveOffset(intranode.KindCombine, 5))
	fmt.Fprintf(&b, "static_assert(GOEP_IN_CTRL_ENTERED + %d * GOEP_IN_CTRL_KIND_STRIDE + 8 * 7 == %d, \"entered\");\n",
		intranode.KindDispatch, intranode.EnteredOffset(intranode.KindDispatch, 7))
	b.WriteString("extern \"C\" __global__ void goep_intranode_probe() {}\n")
	c := kernels.NewCompiler(kernels.Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	_, err := c.CompileSource("intranode_probe", b.String(), kernels.SM90)
	require.NoError(t, err)
}

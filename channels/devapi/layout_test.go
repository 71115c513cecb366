package devapi

import (
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/nvrtc"
	"github.com/goep-dev/goep/kernels"
)

const abiHeader = "../../kernels/channel_abi.cuh"

var (
	sizeRE   = regexp.MustCompile(`static_assert\(sizeof\((\w+)\)\s*==\s*(\d+)`)
	offsetRE = regexp.MustCompile(`static_assert\(GOEP_OFFSETOF\((\w+),\s*(\w+)\)\s*==\s*(\d+)`)
)

// The header's own static_asserts state exactly the Go layout: every struct
// and member of Layout is asserted there with the same number, and the
// header asserts nothing Layout lacks.
func TestHeaderAssertsMatchGoLayout(t *testing.T) {
	src, err := os.ReadFile(abiHeader)
	require.NoError(t, err)
	sizes := map[string]int{}
	for _, m := range sizeRE.FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.Atoi(m[2])
		sizes[m[1]] = n
	}
	offsets := map[string]int{}
	for _, m := range offsetRE.FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.Atoi(m[3])
		offsets[m[1]+"."+m[2]] = n
	}
	seen := map[string]bool{}
	for _, s := range Layout {
		got, ok := sizes[s.Name]
		assert.True(t, ok, "%s: channel_abi.cuh does not static_assert its size", s.Name)
		assert.Equal(t, s.Size, got, "sizeof(%s)", s.Name)
		seen[s.Name] = true
		for _, f := range s.Fields {
			key := s.Name + "." + f.Name
			got, ok := offsets[key]
			assert.True(t, ok, "%s: channel_abi.cuh does not static_assert its offset", key)
			assert.Equal(t, f.Offset, got, "offset of %s", key)
			seen[key] = true
		}
	}
	for k := range sizes {
		assert.True(t, seen[k], "channel_abi.cuh asserts sizeof(%s), which Layout lacks", k)
	}
	for k := range offsets {
		assert.True(t, seen[k], "channel_abi.cuh asserts the offset of %s, which Layout lacks", k)
	}
}

// NVRTC compiles the Go layout, as static_asserts, against the header.
func TestGoLayoutCompilesAgainstHeader(t *testing.T) {
	if _, err := nvrtc.Load(); err != nil {
		if os.Getenv("GOEP_REQUIRE_NVRTC") == "1" {
			t.Fatalf("GOEP_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: %v", err)
		}
		t.Skipf("NVRTC not available: %v", err)
	}
	var b strings.Builder
	b.WriteString("#include \"channel_abi.cuh\"\n")
	for _, s := range Layout {
		fmt.Fprintf(&b, "static_assert(sizeof(%s) == %d, \"Go: sizeof(%s)\");\n", s.Name, s.Size, s.Name)
		for _, f := range s.Fields {
			fmt.Fprintf(&b, "static_assert(GOEP_OFFSETOF(%s, %s) == %d, \"Go: %s.%s\");\n", s.Name, f.Name, f.Offset, s.Name, f.Name)
		}
	}
	b.WriteString("extern \"C\" __global__ void goep_layout_probe() {}\n")
	c := kernels.NewCompiler(kernels.Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	_, err := c.CompileSource("channel_layout_probe", b.String(), kernels.SM90)
	require.NoError(t, err)
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	sem := Semaphore{Inbound: 0x1000, Expected: 0x2008, Remote: 0x7f0000003000, Watchdog: 0x4000, Peer: 7, ID: 42}
	require.Equal(t, sem, DecodeSemaphore(sem.Bytes()))
	mc := MemoryChannel{Sem: sem, Remote: 1 << 40, Local: 2 << 40, RemotePackets: 3 << 40, LocalPackets: 4 << 40,
		Flag: 5 << 40, RemoteSize: 1 << 30, LocalSize: 17, RemotePacketsSize: 32, LocalPacketsSize: 48}
	b := mc.Bytes()
	require.Len(t, b, MemoryChannelSize)
	require.Equal(t, mc, DecodeMemoryChannel(b))
	require.Equal(t, sem, DecodeSemaphore(b[MCSem:]), "the semaphore leads the channel")
	// Reserved bytes stay zero.
	for _, i := range []int{40, 41, 47, 120, 127} {
		require.Zero(t, b[i], "byte %d", i)
	}
	rec := make([]byte, TimeoutRecordSize)
	le.PutUint32(rec[RecordState:], TimeoutExpired)
	le.PutUint32(rec[RecordPeer:], 3)
	le.PutUint64(rec[RecordObserved:], 9)
	require.Equal(t, TimeoutRecord{State: TimeoutExpired, Peer: 3, Observed: 9}, DecodeTimeoutRecord(rec))
}

func TestFlagSequenceSkipsZeroAndAlternatesParity(t *testing.T) {
	require.Equal(t, uint32(1), FlagNext(0))
	require.Equal(t, uint32(2), FlagNext(1))
	f := uint32(0xfffffffd)
	for i := 0; i < 6; i++ {
		n := FlagNext(f)
		require.NotZero(t, n)
		require.NotEqual(t, f&1, n&1, "parity must alternate: %#x -> %#x", f, n)
		f = n
	}
}

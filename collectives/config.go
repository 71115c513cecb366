package collectives

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/collectives/ref"
)

// DataType is an element type: BF16, FP16, FP32 or FP8E4M3.
type DataType = ref.DataType

// Element types.
const (
	BF16    = ref.BF16
	FP16    = ref.FP16
	FP32    = ref.FP32
	FP8E4M3 = ref.FP8E4M3
)

// Op is a reduction: Sum, Min and Max run natively; Prod and Avg only
// through NCCL.
type Op = ref.Op

// Reductions.
const (
	Sum  = ref.Sum
	Min  = ref.Min
	Max  = ref.Max
	Prod = ref.Prod
	Avg  = ref.Avg
)

// Kind is a collective.
type Kind int

const (
	AllReduce Kind = iota
	AllGather
	ReduceScatter
)

// Kinds lists the collectives.
var Kinds = []Kind{AllReduce, AllGather, ReduceScatter}

func (k Kind) String() string {
	switch k {
	case AllReduce:
		return "allreduce"
	case AllGather:
		return "allgather"
	case ReduceScatter:
		return "reducescatter"
	}
	return fmt.Sprintf("collective(%d)", int(k))
}

// ParseKind accepts allreduce, allgather and reducescatter (also with - or
// _ in the middle).
func ParseKind(s string) (Kind, error) {
	t := strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(strings.TrimSpace(s)))
	for _, k := range Kinds {
		if t == k.String() {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown collective %q (want allreduce, allgather or reducescatter)", s)
}

// ABICode is k's code in the kernels' ABI (abi.Kind*, goep_coll_check).
func (k Kind) ABICode() uint32 {
	switch k {
	case AllGather:
		return abi.KindAllGather
	case ReduceScatter:
		return abi.KindReduceScatter
	}
	return abi.KindAllReduce
}

// NCCLMode says when the communicator creates its NCCL communicator.
type NCCLMode int

const (
	// NCCLLazy creates it at the first call that needs NCCL (a fallback, or
	// an explicit "nccl" algorithm), which every rank reaches at the same
	// call. The default.
	NCCLLazy NCCLMode = iota
	// NCCLEager creates it in New, failing New when NCCL cannot be loaded.
	NCCLEager
	// NCCLOff never uses NCCL: what the native algorithms do not cover is an
	// error.
	NCCLOff
)

// Environment variables read by New.
const (
	// EnvTuning names a tuning table (JSON, `ep-bench collectives --tune`)
	// loaded when Config.Tuning is nil.
	EnvTuning = "GOEP_COLL_TUNING"
	// EnvDebug = 1 turns on Config.Debug.
	EnvDebug = "GOEP_COLL_DEBUG"
	// EnvNCCLMode = off, lazy or eager overrides Config.NCCL.
	EnvNCCLMode = "GOEP_COLL_NCCL"
)

// Config configures New. The zero value is ready to use.
type Config struct {
	// Channels configures the channel communicator underneath (the bound of
	// device-side waits: a rank that never calls is named after it).
	Channels channels.Config
	// ScratchBytes is the scratch data area of the bulk algorithms, per
	// rank (default 64 MiB).
	ScratchBytes int
	// PacketBytes is one half of the LL packet buffer, per rank (default
	// 16 MiB): it bounds the LL algorithms' sizes (see Limits).
	PacketBytes int
	// MaxBlocks is the largest grid of the bulk algorithms, the number of
	// per-block semaphore sets (default 64, at most the GPU's SMs).
	MaxBlocks int
	// Threads is the block size of every collective kernel (default 512;
	// a multiple of 32, at most 512).
	Threads int
	// LLMaxBlocks caps the grid of the LL algorithms (default: the GPU's
	// SMs, 8 on the host backend). Every block of an LL kernel must be
	// resident at once.
	LLMaxBlocks int
	// MaxRegistrations is the size of the registration table (default 256).
	MaxRegistrations int
	// Events is the size of the ring of reusable GPU events behind Work
	// handles (default 256): a call records the next one; a Work whose event
	// has since been reused answers from its stream (see Work.Done).
	Events int
	// Tuning is the selector's table; nil loads $GOEP_COLL_TUNING if set,
	// else the built-in rules apply.
	Tuning *Tuning
	// NCCL says when NCCL is loaded ($GOEP_COLL_NCCL overrides it).
	NCCL NCCLMode
	// ForeignHostMemory, on the host backend only, accepts buffers the
	// backend did not allocate (skips its range checks): the NCCL shim's host
	// mode, where C programs pass memory from malloc or another rank's
	// device. Per rank; the CUDA path always checks.
	ForeignHostMemory bool
	// Debug makes every call compare its collective, sizes, type, reduction
	// and algorithm across ranks over the bootstrap first (one round trip
	// per call) and fail, naming the ranks, on a mismatch, before anything
	// is launched. Off by default: the native kernels' call fingerprints
	// (always on, fingerprint.go) already turn a mismatch into ErrMismatch
	// on every rank; Debug also covers the NCCL fallback and plans and
	// fails before any rank launches.
	Debug bool
	// SkipPointerChecks skips the host-side check that send and recv lie
	// in device memory of this GPU (two driver queries per new allocation).
	SkipPointerChecks bool
}

const (
	defaultScratch = 64 << 20
	defaultPackets = 16 << 20
	defaultBlocks  = 64
	defaultThreads = 512
	defaultRegs    = 256
	defaultEvents  = 256
)

func (c Config) resolve(sms int) (Config, error) {
	if c.ScratchBytes == 0 {
		c.ScratchBytes = defaultScratch
	}
	if c.PacketBytes == 0 {
		c.PacketBytes = defaultPackets
	}
	if c.MaxBlocks == 0 {
		c.MaxBlocks = defaultBlocks
		if sms > 0 {
			c.MaxBlocks = min(c.MaxBlocks, sms)
		}
	}
	if c.Threads == 0 {
		c.Threads = defaultThreads
	}
	if c.LLMaxBlocks == 0 {
		c.LLMaxBlocks = 8
		if sms > 0 {
			c.LLMaxBlocks = sms
		}
	}
	if c.MaxRegistrations == 0 {
		c.MaxRegistrations = defaultRegs
	}
	if c.Events == 0 {
		c.Events = defaultEvents
	}
	switch {
	case c.ScratchBytes < 64<<10 || c.ScratchBytes%4096 != 0:
		return c, fmt.Errorf("collectives: ScratchBytes %d: want a multiple of 4096, at least 64 KiB", c.ScratchBytes)
	case c.PacketBytes < 4096 || c.PacketBytes%4096 != 0:
		return c, fmt.Errorf("collectives: PacketBytes %d: want a multiple of 4096, at least 4 KiB", c.PacketBytes)
	case c.MaxBlocks < 1 || c.MaxBlocks > 1024:
		return c, fmt.Errorf("collectives: MaxBlocks %d: want 1..1024", c.MaxBlocks)
	case c.Threads < 32 || c.Threads > abi.KernelMaxThreads || c.Threads%32 != 0:
		return c, fmt.Errorf("collectives: Threads %d: want a multiple of 32 in [32, %d]", c.Threads, abi.KernelMaxThreads)
	case c.LLMaxBlocks < 1:
		return c, fmt.Errorf("collectives: LLMaxBlocks %d must be positive", c.LLMaxBlocks)
	case c.MaxRegistrations < 1 || c.Events < 1:
		return c, fmt.Errorf("collectives: MaxRegistrations and Events must be positive")
	}
	if v := strings.TrimSpace(os.Getenv(EnvDebug)); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("collectives: %s=%q: want 0 or 1", EnvDebug, v)
		}
		c.Debug = c.Debug || on
	}
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvNCCLMode))); v {
	case "":
	case "off", "0", "false":
		c.NCCL = NCCLOff
	case "lazy":
		c.NCCL = NCCLLazy
	case "eager", "1", "true":
		c.NCCL = NCCLEager
	default:
		return c, fmt.Errorf("collectives: %s=%q: want off, lazy or eager", EnvNCCLMode, v)
	}
	return c, nil
}

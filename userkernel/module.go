package userkernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Device is a rank's accelerator, Stream orders work on it, Dim3 is a
// launch shape and Args a kernel's packed parameters: goep's own types,
// named here so that user code needs no internal package.
type (
	Device = device.Device
	Stream = device.Stream
	Dim3   = device.Dim3
	Args   = device.Args
)

// D1 is a one-dimensional Dim3.
func D1(x int) Dim3 { return device.D1(x) }

// NewArgs returns an empty argument list with room for n parameters: append
// them in the kernel's order (Ptr for device pointers and handle arrays,
// U32, I32, U64, I64, F32 for scalars).
func NewArgs(n int) *Args { return device.NewArgs(n) }

// ErrNeedsGPU is returned (wrapped) by Load on a backend that cannot run a
// user's CUDA source: the plain host backend runs only goep's own kernels,
// through their Go twins.
var ErrNeedsGPU = errors.New("user kernels need a GPU (the CUDA backend) or goep's CPU emulation of CUDA sources")

// Source is a user's CUDA C++ program.
type Source struct {
	// Name names the module and the file NVRTC's diagnostics cite
	// (Name + ".cu"): letters, digits, '_' and '-', starting with a
	// letter.
	Name string
	// Code is the program. It may #include goep's headers by name
	// (kernels.Headers), and defines its kernels as
	// `extern "C" __global__ void name(` on one line.
	Code string
	// Options are NVRTC options added after goep's (-DNAME=VALUE, say).
	Options []string
}

// ReadSource reads a .cu file; its base name, without .cu, is the Source's
// Name.
func ReadSource(path string) (Source, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Source{}, fmt.Errorf("userkernel: %w", err)
	}
	return Source{Name: strings.TrimSuffix(filepath.Base(path), ".cu"), Code: string(b)}, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

// Module is a user's source, compiled and loaded for one rank's device;
// safe for concurrent use. It holds nothing to release: the code stays loaded in the GPU's context
// until the last Device on that GPU closes.
type Module struct {
	comm    *channels.Communicator
	dev     device.Device
	name    string // the registered module: Source.Name and a hash
	kernels []string
}

// sourceLoader is a device that builds CUDA sources itself: goep's CPU
// emulation (internal/cpuemu), which this package may not import.
type sourceLoader interface {
	LoadSource(file, src string) ([]string, error)
}

// Load compiles src for comm's device and loads its kernels. It is
// collective: every rank of comm calls it, with the same source, before any
// rank launches one of its kernels. It learns the ranks' placement (the
// spin budget of Launch), loads the code (a module load waits for every
// kernel running in the GPU's context, so it must not happen while a peer's
// kernel spins) and ends with a barrier of comm.
func Load(ctx context.Context, comm *channels.Communicator, src Source) (*Module, error) {
	if comm == nil {
		return nil, errors.New("userkernel: Load needs a communicator")
	}
	rank := comm.Rank()
	errorf := func(format string, a ...any) error {
		return fmt.Errorf("userkernel: rank %d: load %s: "+format, append([]any{rank, src.Name}, a...)...)
	}
	if !nameRE.MatchString(src.Name) {
		return nil, errorf("the name must be letters, digits, '_' and '-', starting with a letter")
	}
	ks := kernels.SourceKernels(src.Code)
	if len(ks) == 0 {
		return nil, errorf("the source defines no kernel written `extern \"C\" __global__ void name(` on one line")
	}
	for i, k := range ks {
		if slices.Contains(ks[:i], k) {
			return nil, errorf("kernel %s is defined twice", k)
		}
	}
	dev := comm.Device()
	if dev == nil {
		return nil, errorf("%w", channels.ErrClosed)
	}
	code := abiPrelude(src.Name) + src.Code
	h := sha256.New()
	h.Write([]byte(code))
	for _, o := range src.Options {
		fmt.Fprintf(h, "\x00%s", o)
	}
	m := &Module{comm: comm, dev: dev, name: src.Name + "-" + hex.EncodeToString(h.Sum(nil))[:16], kernels: ks}
	info := dev.Info()
	switch l, emulated := dev.(sourceLoader); {
	case info.Kind == device.CUDA:
		mod := kernels.Module{Name: m.name, File: src.Name + ".cu", Source: code, Options: src.Options,
			Kernels: ks, CacheOnDisk: true}
		// Compile before registering, so that a source NVRTC rejects
		// leaves nothing behind and its fix may reuse the kernel names.
		// The device compiles with the same process-wide compiler, whose
		// memory cache then has it.
		if _, err := kernels.Default().Compile(mod, kernels.Target{Major: info.Major, Minor: info.Minor}); err != nil {
			return nil, errorf("%w", err)
		}
		if err := kernels.RegisterSource(mod); err != nil {
			return nil, errorf("%w", err)
		}
		if err := dev.Preload(ks...); err != nil {
			return nil, errorf("%w", err)
		}
	case emulated:
		got, err := l.LoadSource(m.name+".cu", code)
		if err != nil {
			return nil, errorf("%w", err)
		}
		if !slices.Equal(got, ks) {
			return nil, errorf("the emulation finds kernels %v, goep's compiler %v", got, ks)
		}
	default:
		return nil, errorf("%w: %s is the %s backend, which runs goep's kernels through Go twins and cannot run a "+
			"CUDA source; run on a GPU (goep's tests and ep-bench run user kernels on CPU threads in the CPU emulation)",
			ErrNeedsGPU, info.Name, info.Kind)
	}
	if _, err := comm.Placement(ctx); err != nil {
		return nil, errorf("%w", err)
	}
	if err := comm.Barrier(ctx); err != nil {
		return nil, errorf("%w", err)
	}
	return m, nil
}

// abiPrelude puts, before the user's code, goep's ABI header and
// static_asserts of every handle struct's size and field offsets as the Go
// side encodes them, then restores the user's file name and line numbers
// for diagnostics.
func abiPrelude(name string) string {
	var b strings.Builder
	b.WriteString("#include \"channel_abi.cuh\"\n")
	for _, s := range devapi.Layout {
		fmt.Fprintf(&b, "static_assert(sizeof(%s) == %d, \"goep: the Go side encodes %s in %d bytes\");\n",
			s.Name, s.Size, s.Name, s.Size)
		for _, f := range s.Fields {
			fmt.Fprintf(&b, "static_assert(GOEP_OFFSETOF(%s, %s) == %d, \"goep: the Go side puts %s.%s at byte %d\");\n",
				s.Name, f.Name, f.Offset, s.Name, f.Name, f.Offset)
		}
	}
	fmt.Fprintf(&b, "#line 1 %q\n", name+".cu")
	return b.String()
}

// Name is the module's name: the Source's, with a hash of its code.
func (m *Module) Name() string {
	if m == nil {
		return ""
	}
	return m.name
}

// Kernels are the kernels the source defines, in source order.
func (m *Module) Kernels() []string {
	if m == nil {
		return nil
	}
	return slices.Clone(m.kernels)
}

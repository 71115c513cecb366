package nvrtc

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/goep-dev/goep/internal/dl"
)

// Library is a loaded NVRTC shared library. It is safe for concurrent use:
// NVRTC allows concurrent calls on distinct programs, and each Compile uses
// its own program.
type Library struct {
	handle       *dl.Library
	path         string // the file the loader mapped
	requested    string // what was passed to dlopen (a path or a soname)
	major, minor int
	archs        []int
	fn           [numSymbols]unsafe.Pointer
}

// Indexes into Library.fn.
const (
	symVersion = iota
	symGetErrorString
	symCreateProgram
	symCompileProgram
	symGetProgramLogSize
	symGetProgramLog
	symGetCUBINSize
	symGetCUBIN
	symGetPTXSize
	symGetPTX
	symDestroyProgram
	symGetNumSupportedArchs // optional (NVRTC 11.2+)
	symGetSupportedArchs    // optional (NVRTC 11.2+)
	numSymbols
)

var symbolNames = [numSymbols]string{
	"nvrtcVersion",
	"nvrtcGetErrorString",
	"nvrtcCreateProgram",
	"nvrtcCompileProgram",
	"nvrtcGetProgramLogSize",
	"nvrtcGetProgramLog",
	"nvrtcGetCUBINSize",
	"nvrtcGetCUBIN",
	"nvrtcGetPTXSize",
	"nvrtcGetPTX",
	"nvrtcDestroyProgram",
	"nvrtcGetNumSupportedArchs",
	"nvrtcGetSupportedArchs",
}

func symbolRequired(i int) bool { return i < symGetNumSupportedArchs }

// Version reports NVRTC's version, e.g. (12, 4).
func (l *Library) Version() (major, minor int) {
	if l == nil {
		return 0, 0
	}
	return l.major, l.minor
}

// Path is the file of the loaded library as the dynamic loader mapped it
// (an absolute path, also when it was found by soname).
func (l *Library) Path() string {
	if l == nil {
		return ""
	}
	return l.path
}

// SupportedArchs lists the SM versions this NVRTC can generate code for
// (e.g. 52, 60, ..., 90), ascending. It is nil when the library does not
// export nvrtcGetSupportedArchs.
func (l *Library) SupportedArchs() []int {
	if l == nil {
		return nil
	}
	return append([]int(nil), l.archs...)
}

// SupportsArch reports whether NVRTC lists sm (e.g. 90) as a supported
// architecture. Without the list it answers true and leaves the verdict to
// the compiler.
func (l *Library) SupportsArch(sm int) bool {
	if l == nil {
		return false
	}
	if l.archs == nil {
		return true
	}
	for _, a := range l.archs {
		if a == sm {
			return true
		}
	}
	return false
}

func (l *Library) String() string {
	if l == nil {
		return ""
	}
	return fmt.Sprintf("NVRTC %d.%d (%s)", l.major, l.minor, l.path)
}

// Program is one compilation: a single translation unit plus headers that
// its #include directives may name, all held in memory.
type Program struct {
	// Name is the file name NVRTC uses for the source in diagnostics
	// ("doctor.cu"); "program.cu" when empty.
	Name   string
	Source string
	// Headers maps include names (as written in #include "...") to their
	// contents. Keys are passed in sorted order.
	Headers map[string]string
	// Options are NVRTC command-line options, one per element
	// ("--gpu-architecture=sm_90", "-std=c++17", "-DX=1").
	Options []string
}

// Output is what a compilation produced. CUBIN is set when the options name
// a real architecture (sm_XX), PTX when they name a virtual one (compute_XX)
// or none. Log holds the compiler's messages (warnings on success).
type Output struct {
	CUBIN []byte
	PTX   []byte
	Log   string
}

// Error is a failed NVRTC API call.
type Error struct {
	Op   string // the NVRTC function
	Code int    // its nvrtcResult
	Msg  string // nvrtcGetErrorString
}

func (e *Error) Error() string {
	if e == nil {
		return "nvrtc: nil *Error"
	}
	return fmt.Sprintf("nvrtc: %s: %s (%d)", e.Op, e.Msg, e.Code)
}

// CompileError is a compilation that NVRTC rejected; Log names the failing
// file(line) and the diagnostic.
type CompileError struct {
	Name string // the program's name
	Code int
	Msg  string
	Log  string
}

func (e *CompileError) Error() string {
	if e == nil {
		return "nvrtc: nil *CompileError"
	}
	log := strings.TrimSpace(e.Log)
	if log == "" {
		log = "(empty log)"
	}
	return fmt.Sprintf("nvrtc: compile %s: %s:\n%s", e.Name, e.Msg, log)
}

// Load finds and opens NVRTC (see the package comment for the search order).
// The outcome is cached: every call returns the same *Library, or the same
// error.
func Load() (*Library, error) { return loadOnce() }

var loadOnce = sync.OnceValues(func() (*Library, error) { return load(osSearchEnv()) })

// errNoCgo is what every entry point returns in a build without cgo.
var errNoCgo = errors.New("nvrtc: this binary was built without cgo (CGO_ENABLED=0), so NVRTC cannot be loaded; rebuild with CGO_ENABLED=1")

func load(env searchEnv) (*Library, error) {
	if !haveCgo {
		return nil, errNoCgo
	}
	spec := searchSpec
	spec.Sonames = env.sonames
	lib, err := dl.Search(spec, env.Env, Open)
	var oe *dl.OverrideError
	var nf *dl.NotFoundError
	switch {
	case err == nil:
		return lib, nil
	case errors.As(err, &oe):
		return nil, fmt.Errorf("nvrtc: %w", err)
	case errors.As(err, &nf):
		return nil, notFound(nf.Tried)
	}
	return nil, fmt.Errorf("nvrtc: %w", err)
}

// archOption extracts the architecture from NVRTC options
// ("--gpu-architecture=sm_90", "-arch=compute_90", or "-arch" "sm_90").
// The last one given wins, as on NVRTC's command line.
func archOption(opts []string) string {
	arch := ""
	for i := 0; i < len(opts); i++ {
		o := opts[i]
		for _, flag := range []string{"--gpu-architecture", "-arch"} {
			switch {
			case strings.HasPrefix(o, flag+"="):
				arch = strings.TrimPrefix(o, flag+"=")
			case o == flag && i+1 < len(opts):
				arch = opts[i+1]
			}
		}
	}
	return arch
}

// wantsCUBIN reports whether the options select a real architecture, so that
// NVRTC produces machine code (CUBIN) rather than PTX only.
func wantsCUBIN(opts []string) bool { return strings.HasPrefix(archOption(opts), "sm_") }

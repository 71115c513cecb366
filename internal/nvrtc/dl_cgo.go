//go:build cgo

package nvrtc

/*
#include <stdlib.h>
#include <string.h>

// Our own minimal view of the NVRTC C API: results are ints and a program is
// an opaque pointer. The library's functions are reached through pointers
// resolved by internal/dl and called via the small trampolines below.
typedef int goep_nvrtc_result;
typedef void *goep_nvrtc_prog;

static goep_nvrtc_result goep_nvrtc_version(void *f, int *major, int *minor) {
	return ((goep_nvrtc_result (*)(int *, int *))f)(major, minor);
}

static const char *goep_nvrtc_error_string(void *f, goep_nvrtc_result r) {
	return ((const char *(*)(goep_nvrtc_result))f)(r);
}

static goep_nvrtc_prog goep_nvrtc_create(void *f, goep_nvrtc_result *res, const char *src,
		const char *name, int num_headers, char **headers, char **include_names) {
	goep_nvrtc_prog prog = NULL;
	*res = ((goep_nvrtc_result (*)(goep_nvrtc_prog *, const char *, const char *, int,
			const char *const *, const char *const *))f)(&prog, src, name, num_headers,
			(const char *const *)headers, (const char *const *)include_names);
	return prog;
}

static goep_nvrtc_result goep_nvrtc_compile(void *f, goep_nvrtc_prog prog, int n, char **opts) {
	return ((goep_nvrtc_result (*)(goep_nvrtc_prog, int, const char *const *))f)(
			prog, n, (const char *const *)opts);
}

// Log, CUBIN and PTX share the same pair of shapes: a size query and a copy
// into a caller-provided buffer.
static goep_nvrtc_result goep_nvrtc_size(void *f, goep_nvrtc_prog prog, size_t *n) {
	return ((goep_nvrtc_result (*)(goep_nvrtc_prog, size_t *))f)(prog, n);
}

static goep_nvrtc_result goep_nvrtc_copy(void *f, goep_nvrtc_prog prog, char *dst) {
	return ((goep_nvrtc_result (*)(goep_nvrtc_prog, char *))f)(prog, dst);
}

static goep_nvrtc_result goep_nvrtc_destroy(void *f, goep_nvrtc_prog prog) {
	return ((goep_nvrtc_result (*)(goep_nvrtc_prog *))f)(&prog);
}

static goep_nvrtc_result goep_nvrtc_num_archs(void *f, int *n) {
	return ((goep_nvrtc_result (*)(int *))f)(n);
}

static goep_nvrtc_result goep_nvrtc_archs(void *f, int *archs) {
	return ((goep_nvrtc_result (*)(int *))f)(archs);
}
*/
import "C"

import (
	"fmt"
	"sort"
	"unsafe"

	"github.com/goep-dev/goep/internal/dl"
)

const haveCgo = true

// Open loads the NVRTC library at path (a file path, or a bare soname that
// the dynamic loader resolves) and resolves its entry points. Unlike Load it
// does not search and does not cache.
func Open(path string) (*Library, error) {
	h, err := dl.OpenLazy(path)
	if err != nil {
		return nil, err
	}
	lib := &Library{handle: h, requested: path, path: h.Path()}
	for i, name := range symbolNames {
		p, err := h.Sym(name)
		if err != nil && symbolRequired(i) {
			h.Close()
			return nil, fmt.Errorf("%s does not export %s (not an NVRTC library, or too old)", path, name)
		}
		lib.fn[i] = p
	}

	var major, minor C.int
	if r := C.goep_nvrtc_version(lib.fn[symVersion], &major, &minor); r != 0 {
		err := lib.apiError("nvrtcVersion", r)
		h.Close()
		return nil, err
	}
	lib.major, lib.minor = int(major), int(minor)

	if lib.fn[symGetNumSupportedArchs] != nil && lib.fn[symGetSupportedArchs] != nil {
		var n C.int
		if C.goep_nvrtc_num_archs(lib.fn[symGetNumSupportedArchs], &n) == 0 && n > 0 && n < 1024 {
			archs := make([]C.int, int(n))
			if C.goep_nvrtc_archs(lib.fn[symGetSupportedArchs], &archs[0]) == 0 {
				for _, a := range archs {
					lib.archs = append(lib.archs, int(a))
				}
				sort.Ints(lib.archs)
			}
		}
	}
	return lib, nil
}

func (l *Library) errorString(r C.goep_nvrtc_result) string {
	if s := C.goep_nvrtc_error_string(l.fn[symGetErrorString], r); s != nil {
		return C.GoString(s)
	}
	return "unknown NVRTC error"
}

func (l *Library) apiError(op string, r C.goep_nvrtc_result) error {
	return &Error{Op: op, Code: int(r), Msg: l.errorString(r)}
}

// cStrings copies ss into C memory: an array of C strings, each NUL
// terminated. free releases all of it. An empty ss gives a nil array.
func cStrings(ss []string) (arr **C.char, free func()) {
	if len(ss) == 0 {
		return nil, func() {}
	}
	arr = (**C.char)(C.malloc(C.size_t(len(ss)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	elems := unsafe.Slice(arr, len(ss))
	for i, s := range ss {
		elems[i] = C.CString(s)
	}
	return arr, func() {
		for _, p := range elems {
			C.free(unsafe.Pointer(p))
		}
		C.free(unsafe.Pointer(arr))
	}
}

// fetch runs one size query and copy pair and returns the bytes, with a
// trailing NUL dropped when trimNUL is set (log and PTX are C strings).
func (l *Library) fetch(prog C.goep_nvrtc_prog, sizeSym, copySym int, trimNUL bool) ([]byte, error) {
	var n C.size_t
	if r := C.goep_nvrtc_size(l.fn[sizeSym], prog, &n); r != 0 {
		return nil, l.apiError(symbolNames[sizeSym], r)
	}
	if n == 0 {
		return nil, nil
	}
	buf := make([]byte, int(n))
	if r := C.goep_nvrtc_copy(l.fn[copySym], prog, (*C.char)(unsafe.Pointer(&buf[0]))); r != 0 {
		return nil, l.apiError(symbolNames[copySym], r)
	}
	if trimNUL {
		for len(buf) > 0 && buf[len(buf)-1] == 0 {
			buf = buf[:len(buf)-1]
		}
	}
	return buf, nil
}

// Compile compiles p. With a real architecture among the options
// ("--gpu-architecture=sm_90") the Output holds CUBIN, otherwise PTX. A
// rejected program gives a *CompileError whose Log has the diagnostics; the
// returned Output carries the same Log.
func (l *Library) Compile(p Program) (Output, error) {
	if l == nil {
		return Output{}, errNil("Library")
	}
	name := p.Name
	if name == "" {
		name = "program.cu"
	}
	includeNames := make([]string, 0, len(p.Headers))
	for k := range p.Headers {
		includeNames = append(includeNames, k)
	}
	sort.Strings(includeNames)
	headers := make([]string, len(includeNames))
	for i, k := range includeNames {
		headers[i] = p.Headers[k]
	}

	csrc := C.CString(p.Source)
	defer C.free(unsafe.Pointer(csrc))
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	chdrs, freeHdrs := cStrings(headers)
	defer freeHdrs()
	cincl, freeIncl := cStrings(includeNames)
	defer freeIncl()
	copts, freeOpts := cStrings(p.Options)
	defer freeOpts()

	var r C.goep_nvrtc_result
	prog := C.goep_nvrtc_create(l.fn[symCreateProgram], &r, csrc, cname,
		C.int(len(headers)), chdrs, cincl)
	if r != 0 {
		return Output{}, l.apiError("nvrtcCreateProgram", r)
	}
	defer C.goep_nvrtc_destroy(l.fn[symDestroyProgram], prog)

	cr := C.goep_nvrtc_compile(l.fn[symCompileProgram], prog, C.int(len(p.Options)), copts)
	logBytes, logErr := l.fetch(prog, symGetProgramLogSize, symGetProgramLog, true)
	out := Output{Log: string(logBytes)}
	if cr != 0 {
		if logErr != nil && out.Log == "" {
			out.Log = "(log unavailable: " + logErr.Error() + ")"
		}
		return out, &CompileError{Name: name, Code: int(cr), Msg: l.errorString(cr), Log: out.Log}
	}

	var err error
	if wantsCUBIN(p.Options) {
		out.CUBIN, err = l.fetch(prog, symGetCUBINSize, symGetCUBIN, false)
		if err == nil && len(out.CUBIN) == 0 {
			err = fmt.Errorf("nvrtc: compile %s: NVRTC returned an empty CUBIN", name)
		}
	} else {
		out.PTX, err = l.fetch(prog, symGetPTXSize, symGetPTX, true)
		if err == nil && len(out.PTX) == 0 {
			err = fmt.Errorf("nvrtc: compile %s: NVRTC returned an empty PTX", name)
		}
	}
	if err != nil {
		return out, err
	}
	return out, nil
}

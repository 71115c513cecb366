//go:build cgo

package dl

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

// goep_dl_open returns the handle, or NULL with *err a malloc'd copy of
// dlerror() (dlerror's buffer is per thread and the next call overwrites it).
static void *goep_dl_open(const char *path, int lazy, char **err) {
	void *h;
	dlerror();
	h = dlopen(path, (lazy ? RTLD_LAZY : RTLD_NOW) | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		*err = strdup(e != NULL ? e : "dlopen failed");
	}
	return h;
}

// goep_dl_sym returns the symbol, or NULL with *err set as above. A symbol
// whose value is NULL counts as missing.
static void *goep_dl_sym(void *h, const char *name, char **err) {
	void *p;
	dlerror();
	p = dlsym(h, name);
	if (p == NULL) {
		const char *e = dlerror();
		*err = strdup(e != NULL ? e : "symbol is NULL");
	}
	return p;
}

static int goep_dl_close(void *h) { return dlclose(h); }

// goep_dl_path is the file the loader mapped for h (absolute also when h
// was opened by soname), or NULL.
static const char *goep_dl_path(void *h) {
	struct link_map *lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL || lm->l_name == NULL || lm->l_name[0] == 0) {
		return NULL;
	}
	return lm->l_name;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

const haveCgo = true

// Library is an open shared library. Its methods are safe for concurrent
// use; Close makes later Sym calls fail instead of touching a closed handle.
type Library struct {
	mu        sync.RWMutex
	h         unsafe.Pointer
	requested string
	path      string
}

// Open loads path (a file, or a bare soname that the dynamic loader
// resolves) with RTLD_NOW|RTLD_LOCAL. The error is "dlopen: " followed by
// dlerror(), which names the file and the reason.
func Open(path string) (*Library, error) { return open(path, false) }

// OpenLazy is Open with RTLD_LAZY: symbols bind at their first call.
func OpenLazy(path string) (*Library, error) { return open(path, true) }

func open(path string, lazy bool) (*Library, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	l := C.int(0)
	if lazy {
		l = 1
	}
	h := C.goep_dl_open(cpath, l, &cerr)
	if h == nil {
		msg := C.GoString(cerr)
		C.free(unsafe.Pointer(cerr))
		return nil, fmt.Errorf("dlopen: %s", msg)
	}
	lib := &Library{h: h, requested: path, path: path}
	if p := C.goep_dl_path(h); p != nil {
		lib.path = C.GoString(p)
	}
	return lib, nil
}

// Sym resolves name. A missing symbol is an error naming it and the file.
func (l *Library) Sym(name string) (unsafe.Pointer, error) {
	if l == nil {
		return nil, fmt.Errorf("dlsym %s: nil library", name)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.h == nil {
		return nil, fmt.Errorf("dlsym %s: %s is closed", name, l.requested)
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr *C.char
	p := C.goep_dl_sym(l.h, cname, &cerr)
	if p == nil {
		msg := C.GoString(cerr)
		C.free(unsafe.Pointer(cerr))
		return nil, fmt.Errorf("dlsym %s in %s: %s", name, l.path, msg)
	}
	return p, nil
}

// Path is the file the dynamic loader mapped (absolute when it could tell).
func (l *Library) Path() string {
	if l == nil {
		return ""
	}
	return l.path
}

// Requested is what was passed to Open.
func (l *Library) Requested() string {
	if l == nil {
		return ""
	}
	return l.requested
}

// Close unloads the library (dlclose). Pointers taken from it must no
// longer be used. Closing twice is a no-op.
func (l *Library) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil {
		return nil
	}
	h := l.h
	l.h = nil
	if C.goep_dl_close(h) != 0 {
		return fmt.Errorf("dlclose %s failed", l.path)
	}
	return nil
}

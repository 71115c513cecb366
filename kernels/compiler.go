package kernels

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/internal/nvrtc"
)

// EnvCacheDir overrides the default cache directory; "off" disables the
// disk cache.
const EnvCacheDir = "GOEP_KERNEL_CACHE"

// DefaultLockTimeout bounds how long a process waits for another one that is
// compiling the same module before it compiles the module itself.
const DefaultLockTimeout = 5 * time.Minute

// Options configure a Compiler. The zero value is ready to use.
type Options struct {
	// CacheDir holds the compiled CUBINs. Empty means $GOEP_KERNEL_CACHE,
	// else os.UserCacheDir()/goep/kernels (~/.cache/goep/kernels on Linux).
	// "off" disables the disk cache. A directory that cannot be created or
	// written never makes a compile fail: results are then kept in memory and
	// the Logger is told once.
	CacheDir string
	// Logger receives compiles (Info), cache hits (Debug) and cache problems
	// (Warn); its handler's level sets the verbosity. nil means
	// slog.Default().
	Logger *slog.Logger
	// NVRTC is the compiler library to use; nil means nvrtc.Load() on first
	// use.
	NVRTC *nvrtc.Library
	// LockTimeout bounds the wait for another process compiling the same
	// module; zero means DefaultLockTimeout.
	LockTimeout time.Duration
}

// Compiled is a module compiled for a target.
type Compiled struct {
	Module Module
	Target Target
	// Arch is what NVRTC compiled for: Target.Arch(), or "sm_90a" for a
	// NeedsArchSpecific module on NVRTC 12+.
	Arch string
	// Options is the full NVRTC option list.
	Options []string
	// CUBIN is shared with the Compiler's memory cache: do not modify it.
	CUBIN []byte
	// FromCache is true when CUBIN came from the disk or memory cache rather
	// than from a compile in this call.
	FromCache bool
	// Duration is the time Compile took, waiting for other processes
	// included.
	Duration time.Duration
	// Key is the hex SHA-256 cache key.
	Key string
	// Path is the cache file, "" when the result lives in memory only.
	Path string
	// Log holds NVRTC's warnings when this call compiled.
	Log string
}

// CompileError is a module that NVRTC rejected (or could not compile). Its
// text is "kernels: compile <module> (<file>) for <arch> with NVRTC X.Y:
// <log>", where the log lines name file(line).
type CompileError struct {
	Module     string
	File       string
	Arch       string
	NVRTCMajor int
	NVRTCMinor int
	// Log is NVRTC's diagnostic output (empty when the failure came before
	// compilation, see Err).
	Log string
	Err error
}

func (e *CompileError) Error() string {
	if e == nil {
		return "kernels: nil *CompileError"
	}
	detail := strings.TrimSpace(e.Log)
	if detail == "" && e.Err != nil {
		detail = e.Err.Error()
	}
	return fmt.Sprintf("kernels: compile %s (%s) for %s with NVRTC %d.%d: %s",
		e.Module, e.File, e.Arch, e.NVRTCMajor, e.NVRTCMinor, detail)
}

func (e *CompileError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// errNilCompiler is what the methods of a nil *Compiler return.
var errNilCompiler = errors.New("kernels: nil Compiler (NewCompiler or Default makes one)")

// Compiler compiles modules and caches the results. It is safe for
// concurrent use; one process compiles a given module and target once.
type Compiler struct {
	opts Options
	log  *slog.Logger

	libOnce sync.Once
	lib     *nvrtc.Library
	libID   string // version and library file, part of every cache key
	libErr  error

	dirOnce  sync.Once
	dir      string // "" when there is no disk cache
	writable bool

	warnOnce sync.Once

	mu       sync.Mutex
	mem      map[[32]byte][]byte
	inflight map[[32]byte]*sync.Mutex
}

// NewCompiler returns a Compiler. Nothing is loaded or created until the
// first compile.
func NewCompiler(opts Options) *Compiler {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Compiler{
		opts:     opts,
		log:      log,
		mem:      map[[32]byte][]byte{},
		inflight: map[[32]byte]*sync.Mutex{},
	}
}

var defaultCompiler = sync.OnceValue(func() *Compiler { return NewCompiler(Options{}) })

// Default is the process-wide Compiler with default Options.
func Default() *Compiler { return defaultCompiler() }

func (c *Compiler) library() (*nvrtc.Library, error) {
	c.libOnce.Do(func() {
		c.lib = c.opts.NVRTC
		if c.lib == nil {
			c.lib, c.libErr = nvrtc.Load()
		}
		if c.libErr != nil {
			c.libErr = fmt.Errorf("kernels: %w", c.libErr)
			return
		}
		major, minor := c.lib.Version()
		file := c.lib.Path()
		if real, err := filepath.EvalSymlinks(file); err == nil {
			file = real
		}
		// The file name carries the patch version (libnvrtc.so.12.4.127),
		// which nvrtcVersion does not report.
		c.libID = fmt.Sprintf("NVRTC %d.%d %s", major, minor, filepath.Base(file))
	})
	return c.lib, c.libErr
}

// NVRTCVersion loads NVRTC if needed and reports its version.
func (c *Compiler) NVRTCVersion() (major, minor int, err error) {
	if c == nil {
		return 0, 0, errNilCompiler
	}
	lib, err := c.library()
	if err != nil {
		return 0, 0, err
	}
	major, minor = lib.Version()
	return major, minor, nil
}

// CacheDir is the disk cache in use, "" when there is none (disabled, or it
// could not be created). Results are also not written there when the
// directory exists but is read-only.
func (c *Compiler) CacheDir() string {
	if c == nil {
		return ""
	}
	c.resolveDir()
	return c.dir
}

func (c *Compiler) resolveDir() {
	c.dirOnce.Do(func() {
		dir := c.opts.CacheDir
		if dir == "" {
			dir = os.Getenv(EnvCacheDir)
		}
		if dir == "off" {
			c.log.Debug("kernels: disk cache disabled; compiled kernels are kept in memory")
			return
		}
		if dir == "" {
			base, err := os.UserCacheDir()
			if err != nil {
				c.warnMemoryOnly("", err)
				return
			}
			dir = filepath.Join(base, "goep", "kernels")
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			c.warnMemoryOnly(dir, err)
			return
		}
		c.dir = dir
		if err := probeWritable(dir); err != nil {
			// Still read what is there (a cache baked into an image, say).
			c.warnMemoryOnly(dir, err)
			return
		}
		c.writable = true
	})
}

func (c *Compiler) warnMemoryOnly(dir string, err error) {
	c.warnOnce.Do(func() {
		c.log.Warn("kernels: cannot write the kernel cache; compiled kernels are kept in memory for this process only "+
			"(set "+EnvCacheDir+" to a writable directory to keep them)", "dir", dir, "err", err)
	})
}

func (c *Compiler) diskWritable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writable
}

func (c *Compiler) disableWrites(dir string, err error) {
	c.mu.Lock()
	c.writable = false
	c.mu.Unlock()
	c.warnMemoryOnly(dir, err)
}

// compileOptions returns the full NVRTC option list for m on t with an NVRTC
// of the given major version, and the architecture compiled for.
func compileOptions(m Module, t Target, nvrtcMajor int) ([]string, string) {
	major := nvrtcMajor
	arch := t.Arch()
	archSpecific := m.NeedsArchSpecific && major >= 12 && t.SM() >= 90
	if archSpecific {
		arch += "a"
	}
	tma := major >= 12 && t.SM() >= 90
	opts := []string{"-std=c++17", "--gpu-architecture=" + arch}
	// -lineinfo maps SASS back to source lines for profilers at no run-time
	// cost. NVRTC 11.8 crashes (SIGSEGV inside nvrtcCompileProgram, taking
	// the process with it) when asked for line info on sm_90 code that has
	// inlined device functions, so it is left out there.
	if major >= 12 || t.SM() < 90 {
		opts = append(opts, "-lineinfo")
	}
	opts = append(opts,
		"-DGOEP_ENABLE_TMA="+boolDigit(tma),
		"-DGOEP_ARCH_SPECIFIC="+boolDigit(archSpecific),
	)
	// The measurement switches (internal/kernelflags; none by default) go
	// into the option list, hence into the cache key: a switched build
	// never shares a cache entry with a default one.
	opts = append(opts, kernelflags.Defines()...)
	return append(opts, m.Options...), arch
}

func boolDigit(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func (c *Compiler) keyMutex(k [32]byte) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	mu := c.inflight[k]
	if mu == nil {
		mu = &sync.Mutex{}
		c.inflight[k] = mu
	}
	return mu
}

func (c *Compiler) memGet(k [32]byte) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.mem[k]
	return b, ok
}

func (c *Compiler) memPut(k [32]byte, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mem[k] = b
}

// Compile returns m compiled for t, from the cache when possible. Among
// processes sharing a cache directory, one compiles and the others wait for
// its file (bounded by Options.LockTimeout).
func (c *Compiler) Compile(m Module, t Target) (*Compiled, error) {
	if c == nil {
		return nil, errNilCompiler
	}
	start := time.Now()
	if m.Name == "" || m.File == "" || strings.ContainsAny(m.Name, `/\`) || strings.ContainsAny(m.File, `/\`) {
		return nil, fmt.Errorf("kernels: module %q (%q) needs a Name and a File, without path separators", m.Name, m.File)
	}
	lib, err := c.library()
	if err != nil {
		return nil, fmt.Errorf("kernels: compile %s (%s) for %s: %w", m.Name, m.File, t.Arch(), err)
	}
	src := m.Source
	if src == "" {
		if src, err = sourceFile(m.File); err != nil {
			return nil, err
		}
	}
	if t.SM() < 70 {
		return nil, fmt.Errorf("kernels: compile %s (%s) for %s: goep kernels need sm_70 or newer", m.Name, m.File, t.Arch())
	}
	if !lib.SupportsArch(t.SM()) {
		major, minor := lib.Version()
		return nil, fmt.Errorf("kernels: compile %s (%s) for %s: NVRTC %d.%d cannot generate code for it (it supports sm_%v); install a newer NVRTC",
			m.Name, m.File, t.Arch(), major, minor, lib.SupportedArchs())
	}
	nvMajor, _ := lib.Version()
	opts, arch := compileOptions(m, t, nvMajor)
	key := cacheKey(m, src, opts, arch, c.libID)
	res := &Compiled{Module: m, Target: t, Arch: arch, Options: opts, Key: keyString(key)}
	done := func(cubin []byte, fromCache bool) (*Compiled, error) {
		res.CUBIN, res.FromCache, res.Duration = cubin, fromCache, time.Since(start)
		return res, nil
	}

	kmu := c.keyMutex(key)
	kmu.Lock()
	defer kmu.Unlock()

	if b, ok := c.memGet(key); ok {
		return done(b, true)
	}
	memoryOnly := m.Source != "" && !m.CacheOnDisk
	if !memoryOnly {
		c.resolveDir()
	}
	if memoryOnly || c.dir == "" {
		cubin, log, err := c.compile(lib, m, src, opts, arch)
		if err != nil {
			return nil, err
		}
		c.memPut(key, cubin)
		res.Log = log
		return done(cubin, false)
	}

	res.Path = filepath.Join(c.dir, fmt.Sprintf("%s-%s.cubin", m.Name, res.Key[:16]))
	if cubin, ok := c.load(res.Path, key, true); ok {
		c.memPut(key, cubin)
		c.log.Debug("kernels: cache hit", "module", m.Name, "arch", arch, "path", res.Path, "took", time.Since(start))
		return done(cubin, true)
	}

	if c.diskWritable() {
		unlock, lerr := lockFile(res.Path+".lock", c.opts.LockTimeout)
		switch {
		case lerr == nil:
			defer unlock()
			// Whoever held the lock may have just written the file.
			if cubin, ok := c.load(res.Path, key, false); ok {
				c.memPut(key, cubin)
				c.log.Debug("kernels: cache hit after waiting for another compiler", "module", m.Name, "arch", arch,
					"path", res.Path, "took", time.Since(start))
				return done(cubin, true)
			}
		case errors.Is(lerr, errLockTimeout):
			c.log.Warn("kernels: another process holds the cache lock too long; compiling here as well",
				"module", m.Name, "lock", res.Path+".lock", "waited", c.opts.LockTimeout)
		default:
			c.disableWrites(c.dir, lerr)
		}
	}

	cubin, log, err := c.compile(lib, m, src, opts, arch)
	if err != nil {
		return nil, err
	}
	res.Log = log
	c.memPut(key, cubin)
	if c.diskWritable() {
		if werr := writeCacheFile(res.Path, cubin, key); werr != nil {
			c.disableWrites(c.dir, werr)
			res.Path = ""
		}
	} else {
		res.Path = ""
	}
	c.log.Info("kernels: compiled", "module", m.Name, "arch", arch, "nvrtc", c.libID,
		"took", time.Since(start).Round(time.Millisecond), "path", res.Path)
	return done(cubin, false)
}

// load reads and validates a cache file; an invalid one is treated as
// absent, and reported when report is set.
func (c *Compiler) load(path string, key [32]byte, report bool) ([]byte, bool) {
	cubin, err := readCacheFile(path, key)
	switch {
	case err == nil:
		return cubin, true
	case errors.Is(err, fs.ErrNotExist), !report:
	case errors.Is(err, errCorrupt):
		c.log.Warn("kernels: ignoring invalid cache file; recompiling", "path", path, "err", err)
	default:
		c.log.Warn("kernels: cannot read cache file; recompiling", "path", path, "err", err)
	}
	return nil, false
}

func (c *Compiler) compile(lib *nvrtc.Library, m Module, src string, opts []string, arch string) ([]byte, string, error) {
	out, err := lib.Compile(nvrtc.Program{Name: m.File, Source: src, Headers: headers(), Options: opts})
	if err != nil {
		major, minor := lib.Version()
		return nil, "", &CompileError{Module: m.Name, File: m.File, Arch: arch,
			NVRTCMajor: major, NVRTCMinor: minor, Log: out.Log, Err: err}
	}
	return out.CUBIN, out.Log, nil
}

// CompileAll compiles every registered module for t, a few at a time, and
// returns the results in Modules order. Failures are joined into one error;
// the successful results are still returned.
func (c *Compiler) CompileAll(t Target) ([]*Compiled, error) {
	if c == nil {
		return nil, errNilCompiler
	}
	mods := Modules()
	out := make([]*Compiled, len(mods))
	errs := make([]error, len(mods))
	workers := min(len(mods), runtime.GOMAXPROCS(0), 4)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i], errs[i] = c.Compile(mods[i], t)
			}
		}()
	}
	for i := range mods {
		next <- i
	}
	close(next)
	wg.Wait()
	return out, errors.Join(errs...)
}

// CompileSource compiles an inline program with the same headers and
// options as the registered modules. name is the module name; NVRTC reports
// diagnostics against name+".cu". The result is cached in memory only.
func (c *Compiler) CompileSource(name, src string, t Target) (*Compiled, error) {
	name = strings.TrimSuffix(name, ".cu")
	return c.Compile(Module{Name: name, File: name + ".cu", Source: src}, t)
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"text/tabwriter"

	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/kernels"
)

func init() {
	register("kernels", "compile every kernel module ahead of time into the cache and print per-module times", runKernels)
}

func runKernels(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("kernels", stderr)
	arch := fs.String("arch", "", "target such as sm_90 (default: GPU 0's, else sm_90)")
	cacheDir := fs.String("cache", "", "cache directory (default $GOEP_KERNEL_CACHE, else the user cache dir; 'off' for none)")
	if err := parse(fs, args); err != nil {
		return err
	}
	target, from, err := kernelTarget(*arch)
	if err != nil {
		return err
	}
	// The table below says what the compiler would log.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := kernels.NewCompiler(kernels.Options{CacheDir: *cacheDir, Logger: quiet})
	maj, min, err := c.NVRTCVersion()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "target %s (%s), NVRTC %d.%d, cache %s\n", target, from, maj, min, orNone(c.CacheDir()))
	compiled, err := compileAll(ctx, c, target, newProgress(stderr))
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "module\tarch\tsource\ttime\tCUBIN KiB\tkernels\t")
	for _, m := range compiled {
		if m == nil {
			continue
		}
		src := "compiled"
		if m.FromCache {
			src = "cache"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t\n", m.Module.Name, m.Arch, src, ms(m.Duration), len(m.CUBIN)>>10, len(m.Module.Kernels))
	}
	tw.Flush()
	return err
}

// compileAll is kernels.Compiler.CompileAll with a progress line per module
// (a first compile of every module takes minutes on a small machine) and a
// stop between modules when ctx is cancelled.
func compileAll(ctx context.Context, c *kernels.Compiler, t kernels.Target, prog *progress) ([]*kernels.Compiled, error) {
	mods := kernels.Modules()
	out := make([]*kernels.Compiled, len(mods))
	errs := make([]error, len(mods))
	next := make(chan int)
	var wg sync.WaitGroup
	var done atomic.Int32
	for range min(len(mods), runtime.GOMAXPROCS(0), 4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if errs[i] = interrupted(ctx); errs[i] != nil {
					continue
				}
				out[i], errs[i] = c.Compile(mods[i], t)
				how := "compiled"
				if errs[i] != nil {
					how = "failed"
				} else if out[i].FromCache {
					how = "from the cache"
				}
				prog.printf("module %s %s (%d/%d)", mods[i].Name, how, done.Add(1), len(mods))
			}
		}()
	}
	for i := range mods {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := interrupted(ctx); err != nil {
		return out, err
	}
	return out, errors.Join(errs...)
}

func orNone(s string) string {
	if s == "" {
		return "(memory only)"
	}
	return s
}

// kernelTarget picks the compile target: the flag, else GPU 0, else sm_90.
func kernelTarget(flagArch string) (kernels.Target, string, error) {
	if flagArch != "" {
		t, err := kernels.ParseTarget(flagArch)
		return t, "from --arch", err
	}
	if cuda.Load() == nil {
		if dev, err := cuda.GetDevice(0); err == nil {
			if maj, min, err := dev.ComputeCapability(); err == nil {
				return kernels.Target{Major: maj, Minor: min}, "GPU 0", nil
			}
		}
	}
	return kernels.Target{Major: 9, Minor: 0}, "no GPU: default", nil
}

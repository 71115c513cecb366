package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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
	compiled, err := c.CompileAll(target)
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

package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/nvrtc"
	"github.com/goep-dev/goep/kernels"
)

func init() {
	register("doctor", "check driver, NVRTC, GPUs, peer access, IPC between ranks, JIT compile and the host backend", runDoctor)
}

// warmLoadBudget is the most a module may take to come back from the disk
// cache and load onto the GPU.
const warmLoadBudget = 50 * time.Millisecond

type doctor struct {
	r       *report
	env     bootstrap.EnvInfo
	bs      bootstrap.Bootstrap // nil for a single rank
	kind    device.Kind
	gpus    int // 0 when the driver is unusable
	bytes   int
	target  kernels.Target
	haveJIT bool
}

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("doctor", stderr)
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	jsonPath := fs.String("json", "", "also write the report as JSON to this file (rank 0)")
	mib := fs.Int("mib", 64, "MiB per rank for the memory and IPC checks")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *mib < 1 || *mib > 1<<20 {
		return fmt.Errorf("--mib %d: want 1..%d", *mib, 1<<20)
	}
	if err := checkOutput("json", *jsonPath); err != nil {
		return err
	}
	env, err := launcherEnv("doctor", device.Host)
	if err != nil {
		return err
	}
	kind, why, err := device.ParseKind(*backend)
	if err != nil {
		return err
	}
	d := &doctor{r: &report{}, env: env, kind: kind, bytes: *mib << 20, target: kernels.Target{Major: 9, Minor: 0}}
	if env.Size > 1 {
		if d.bs, err = bootstrap.ConnectFromEnv(ctx, env, 0); err != nil {
			return err
		}
		defer d.bs.Close()
	}
	d.r.info("ranks", "launcher", "%s: rank %d of %d (local %d of %d)", launchedBy(env), env.Rank, env.Size, env.LocalRank, env.LocalSize)

	var prog *progress
	if env.Rank == 0 {
		prog = newProgress(stderr)
	}
	steps := []struct {
		what string
		run  func()
	}{
		{"driver", func() { d.checkDriver(why) }},
		{"NVRTC", d.checkNVRTC},
		{"GPUs", func() {
			if env.LocalRank == 0 {
				d.listGPUs()
			}
		}},
		{"kernel compilation (the first run compiles every module: minutes)", d.checkJIT},
		{"ranks", func() { d.checkRanks(ctx) }},
		{"host backend", func() { d.checkHostBackend(ctx) }},
	}
	for i, st := range steps {
		if err := interrupted(ctx); err != nil {
			return err
		}
		prog.printf("checking %s (%d/%d)", st.what, i+1, len(steps))
		st.run()
	}
	if err := interrupted(ctx); err != nil {
		return err
	}

	return d.finish(ctx, stdout, *jsonPath)
}

func (d *doctor) checkDriver(why string) {
	if err := cuda.Load(); err != nil {
		d.r.info("driver", "libcuda", "not usable: %v", err)
		d.r.info("driver", "GPU", "no CUDA GPU found; the host backend serves instead")
		if d.kind == device.CUDA {
			d.r.fail("driver", "backend", "--backend cuda asked for, but no GPU is usable")
		}
		return
	}
	v, err := cuda.DriverVersion()
	if err != nil {
		d.r.fail("driver", "version", "%v", err)
		return
	}
	d.r.ok("driver", "version", "CUDA %d.%d (libcuda through cuGetProcAddress_v2 at API 12.0)", v/1000, v%1000/10)
	n, err := cuda.DeviceCount()
	if err != nil {
		d.r.fail("driver", "devices", "%v", err)
		return
	}
	if n == 0 {
		d.r.info("driver", "GPU", "the driver reports no GPU (%s); the host backend serves instead", why)
		return
	}
	d.gpus = n
	if d.kind == device.CUDA && d.env.LocalRank >= n {
		d.r.fail("driver", "GPU", "local rank %d needs GPU %d, but only %d are visible", d.env.LocalRank, d.env.LocalRank, n)
		d.gpus = 0
	}
}

func (d *doctor) checkNVRTC() {
	lib, err := nvrtc.Load()
	if err != nil {
		if d.gpus > 0 && d.kind == device.CUDA {
			d.r.fail("nvrtc", "library", "%v", err)
		} else {
			d.r.skip("nvrtc", "library", "%v", err)
		}
		return
	}
	maj, min := lib.Version()
	d.r.ok("nvrtc", "library", "NVRTC %d.%d at %s", maj, min, lib.Path())
	d.haveJIT = true
}

func (d *doctor) listGPUs() {
	if d.gpus == 0 {
		return
	}
	devs := make([]cuda.Device, d.gpus)
	for i := range devs {
		dev, err := cuda.GetDevice(i)
		if err != nil {
			d.r.fail("gpus", fmt.Sprintf("GPU %d", i), "%v", err)
			return
		}
		devs[i] = dev
		name, _ := dev.Name()
		sms, _ := dev.MultiprocessorCount()
		maj, min, _ := dev.ComputeCapability()
		mem, _ := dev.TotalMem()
		bus, _ := dev.PCIBusID()
		d.r.info("gpus", fmt.Sprintf("GPU %d", i), "%s, %d SMs, %.1f GiB, sm_%d%d, PCI %s", name, sms, float64(mem)/(1<<30), maj, min, bus)
	}
	if d.gpus < 2 {
		return
	}
	var rows []string
	pairs, ok := 0, 0
	for i, a := range devs {
		row := make([]byte, len(devs))
		for j, b := range devs {
			if i == j {
				row[j] = '.'
				continue
			}
			pairs++
			can, err := a.CanAccessPeer(b)
			switch {
			case err != nil:
				row[j] = '?'
			case can:
				row[j] = 'o'
				ok++
			default:
				row[j] = 'x'
			}
		}
		rows = append(rows, fmt.Sprintf("GPU %d  %s", i, row))
	}
	status := d.r.ok
	if ok != pairs {
		status = d.r.fail
	}
	status("gpus", "peer access", "%d/%d ordered pairs (o = can access, x = cannot)\n%s", ok, pairs, strings.Join(rows, "\n"))
}

// checkJIT compiles every module cold into a scratch cache and loads it back
// warm (rank 0 only), then runs the pattern kernels on this rank's device.
func (d *doctor) checkJIT() {
	// The packages that launch the kernels register their modules: this
	// binary must link every one of them.
	if err := kernels.CheckRegistry(); err != nil {
		d.r.fail("jit", "modules", "%v", err)
	} else {
		d.r.ok("jit", "modules", "%d modules, every embedded source registered", len(kernels.Modules()))
	}
	if !d.haveJIT {
		d.r.skip("jit", "compile", "no NVRTC")
		return
	}
	var ctx *cuda.Context
	if d.gpus > 0 {
		dev, err := cuda.GetDevice(d.env.LocalRank)
		if err == nil {
			maj, min, _ := dev.ComputeCapability()
			d.target = kernels.Target{Major: maj, Minor: min}
			ctx, err = dev.Retain()
		}
		if err != nil {
			d.r.fail("jit", "context", "%v", err)
			return
		}
		defer ctx.Release()
	}
	if d.env.Rank == 0 {
		d.coldAndWarm(ctx)
	}
	if d.gpus > 0 && d.kind == device.CUDA {
		d.checkPatternOn(device.CUDA, d.env.LocalRank)
	}
}

func (d *doctor) coldAndWarm(ctx *cuda.Context) {
	dir, err := os.MkdirTemp("", "goep-doctor-cache-")
	if err != nil {
		d.r.fail("jit", "scratch cache", "%v", err)
		return
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cold := kernels.NewCompiler(kernels.Options{CacheDir: dir, Logger: quiet})
	for _, m := range kernels.Modules() {
		c, err := cold.Compile(m, d.target)
		if err != nil {
			d.r.fail("jit", m.Name, "%v", err)
			continue
		}
		// A new Compiler has an empty memory cache: this is the disk path a
		// second process takes.
		w, err := kernels.NewCompiler(kernels.Options{CacheDir: dir, Logger: quiet}).Compile(m, d.target)
		if err != nil || !w.FromCache {
			d.r.fail("jit", m.Name, "warm load missed the cache (err %v)", err)
			continue
		}
		warm := w.Duration
		load := time.Duration(0)
		if ctx != nil {
			start := time.Now()
			mod, err := cuda.ModuleLoadData(ctx, w.CUBIN)
			load = time.Since(start)
			if err != nil {
				d.r.fail("jit", m.Name, "module load: %v", err)
				continue
			}
			_ = mod.Unload()
		}
		// A slow warm load is reported, not failed: timings depend on the
		// machine's load, and a check must not fail on a busy machine.
		status := d.r.ok
		if warm+load > warmLoadBudget {
			status = d.r.info
		}
		loaded := "not loaded: no GPU"
		if ctx != nil {
			loaded = "module load " + ms(load)
		}
		slow := ""
		if warm+load > warmLoadBudget {
			slow = fmt.Sprintf("; slower than the %s goal (a busy machine?)", warmLoadBudget)
		}
		status("jit", m.Name, "%s: cold compile %s, warm cache load %s + %s (%d KiB CUBIN)%s",
			c.Arch, ms(c.Duration), ms(warm), loaded, len(c.CUBIN)>>10, slow)
	}
}

func ms(t time.Duration) string { return fmt.Sprintf("%.2f ms", float64(t)/1e6) }

// checkPatternOn fills and checks a buffer with the pattern kernels.
func (d *doctor) checkPatternOn(kind device.Kind, ordinal int) {
	dev, err := device.Open(kind, ordinal)
	if err != nil {
		d.r.fail("jit", "launch", "%v", err)
		return
	}
	defer dev.Close()
	n := d.bytes / 4
	start := time.Now()
	bad, err := fillAndCheck(dev, n, 77)
	switch {
	case err != nil:
		d.r.fail("jit", "launch", "%v", err)
	case bad != 0:
		d.r.fail("jit", "launch", "%d of %d words wrong after fill and check", bad, n)
	default:
		d.r.ok("jit", "launch", "fill + check of %d MiB on %s %d: 0 mismatches (%s incl. first load)", d.bytes>>20, kind, ordinal, ms(time.Since(start)))
	}
}

func fillAndCheck(dev device.Device, n int, seed uint32) (uint64, error) {
	buf, err := dev.Alloc(4 * n)
	if err != nil {
		return 0, err
	}
	defer dev.Free(buf)
	if err := fill(dev, buf.Ptr, n, seed); err != nil {
		return 0, err
	}
	return countMismatches(dev, buf.Ptr, n, seed)
}

func fill(dev device.Device, p uintptr, n int, seed uint32) error {
	if err := dev.Launch(device.KernelFillPattern, device.D1(264), device.D1(512), 0, nil,
		device.NewArgs(3).Ptr(p).U64(uint64(n)).U32(seed)); err != nil {
		return err
	}
	return dev.DefaultStream().Synchronize()
}

// countMismatches checks n words at p (local or a peer's) against the pattern.
func countMismatches(dev device.Device, p uintptr, n int, seed uint32) (uint64, error) {
	cnt, err := dev.Alloc(8)
	if err != nil {
		return 0, err
	}
	defer dev.Free(cnt)
	if err := dev.CopyIn(cnt.Ptr, make([]byte, 8)); err != nil {
		return 0, err
	}
	if err := dev.Launch(device.KernelCheckPattern, device.D1(264), device.D1(512), 0, nil,
		device.NewArgs(4).Ptr(p).U64(uint64(n)).U32(seed).Ptr(cnt.Ptr)); err != nil {
		return 0, err
	}
	if err := dev.DefaultStream().Synchronize(); err != nil {
		return 0, err
	}
	var b [8]byte
	if err := dev.CopyOut(b[:], cnt.Ptr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// checkRanks reads every other rank's memory: across processes through IPC
// when launched with several ranks, else across this process's GPUs through
// goroutine ranks and peer access.
func (d *doctor) checkRanks(ctx context.Context) {
	if d.gpus == 0 || d.kind != device.CUDA || !d.haveJIT {
		return
	}
	if d.bs != nil {
		d.crossProcess(ctx)
		return
	}
	if d.gpus > 1 {
		bss, err := bootstrap.NewInProcess(d.gpus, bootstrap.Config{})
		if err != nil {
			d.r.fail("ranks", "goroutine ranks", "%v", err)
			return
		}
		rows, err := readPeers(ctx, device.CUDA, bss, d.bytes/4)
		reportMatrix(d.r, "goroutine ranks", "peer access", rows, err)
	}
}

// readPeers runs the pattern exchange on goroutine ranks (one per GPU or
// host device) and returns each rank's row of the result matrix.
func readPeers(ctx context.Context, kind device.Kind, bss []bootstrap.Bootstrap, n int) ([]string, error) {
	rows := make([]string, len(bss))
	errs := make([]error, len(bss))
	var wg sync.WaitGroup
	for r, bs := range bss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer bs.Close()
			dev, err := device.Open(kind, r)
			if err != nil {
				errs[r] = err
				return
			}
			defer dev.Close()
			rows[r], errs[r] = exchangeAndCheck(ctx, bs, dev, n)
		}()
	}
	wg.Wait()
	return rows, errors.Join(errs...)
}

// exchangeAndCheck: fill own buffer with seed 1000+rank, share it, check
// every peer's buffer in place. The row has 'o' for a good peer, 'X' for a
// bad one and '.' for itself.
func exchangeAndCheck(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, n int) (string, error) {
	me := bs.Rank()
	buf, err := dev.Alloc(4 * n)
	if err != nil {
		return "", err
	}
	defer dev.Free(buf)
	if err := fill(dev, buf.Ptr, n, uint32(1000+me)); err != nil {
		return "", err
	}
	h, err := dev.Export(buf)
	if err != nil {
		return "", err
	}
	all, err := bs.AllGather(ctx, h)
	if err != nil {
		return "", err
	}
	row := make([]byte, len(all))
	var errs []error
	for peer, ph := range all {
		if peer == me {
			row[peer] = '.'
			continue
		}
		row[peer] = 'X'
		view, err := dev.Import(ph)
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d: import from rank %d: %w", me, peer, err))
			continue
		}
		bad, err := countMismatches(dev, view.Ptr, n, uint32(1000+peer))
		if err == nil && bad == 0 {
			row[peer] = 'o'
		} else if err == nil {
			err = fmt.Errorf("%d of %d words wrong", bad, n)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d reading rank %d: %w", me, peer, err))
		}
		if err := dev.CloseImport(view); err != nil {
			errs = append(errs, err)
		}
	}
	// Nobody frees its buffer while a peer may still read it.
	if err := bs.Barrier(ctx); err != nil {
		errs = append(errs, err)
	}
	return string(row), errors.Join(errs...)
}

func reportMatrix(r *report, section, name string, rows []string, err error) {
	pairs, ok := 0, 0
	for i, row := range rows {
		for j, c := range row {
			if i != j {
				pairs++
				if c == 'o' {
					ok++
				}
			}
		}
		rows[i] = fmt.Sprintf("rank %d  %s", i, row)
	}
	if err != nil || ok != pairs || pairs == 0 {
		r.fail(section, name, "%d/%d ordered pairs read back correctly (o = correct, X = wrong)\n%s\n%v", ok, pairs, strings.Join(rows, "\n"), err)
		return
	}
	r.ok(section, name, "%d/%d ordered pairs read back correctly\n%s", ok, pairs, strings.Join(rows, "\n"))
}

// crossProcess: legacy IPC handles through the bootstrap, then VMM
// allocations whose file descriptors cross over a Unix-domain socket.
func (d *doctor) crossProcess(ctx context.Context) {
	dev, err := device.Open(device.CUDA, d.env.LocalRank)
	if err != nil {
		d.r.fail("ipc", "open", "%v", err)
		return
	}
	defer dev.Close()
	n := d.bytes / 4
	row, err := exchangeAndCheck(ctx, d.bs, dev, n)
	d.gatherRows(ctx, "cuda ipc", row, err)

	row, err = d.vmmExchange(ctx, dev, n)
	d.gatherRows(ctx, "vmm fd", row, err)
}

// gatherRows collects every rank's row on rank 0 and reports the matrix.
func (d *doctor) gatherRows(ctx context.Context, name, row string, rowErr error) {
	msg := row
	if rowErr != nil {
		msg += "\n" + rowErr.Error()
	}
	all, err := d.bs.AllGather(ctx, []byte(msg))
	if err != nil {
		d.r.fail("ipc", name, "gathering results: %v", err)
		return
	}
	if d.env.Rank != 0 {
		if rowErr != nil {
			d.r.fail("ipc", name, "%v", rowErr)
		}
		return
	}
	rows := make([]string, len(all))
	var errs []error
	for r, m := range all {
		parts := strings.SplitN(string(m), "\n", 2)
		rows[r] = parts[0]
		if len(parts) == 2 {
			errs = append(errs, errors.New(parts[1]))
		}
	}
	reportMatrix(d.r, "ipc", name, rows, errors.Join(errs...))
}

type vmmer interface{ Context() *cuda.Context }

func (d *doctor) vmmExchange(ctx context.Context, dev device.Device, n int) (string, error) {
	cd, ok := dev.(vmmer)
	if !ok {
		return "", fmt.Errorf("not a CUDA device")
	}
	me, size := d.bs.Rank(), d.bs.Size()
	fx, err := bootstrap.NewFDExchanger(ctx, d.bs, 0)
	if err != nil {
		return "", err
	}
	defer fx.Close()
	mine, err := cuda.AllocVMM(cd.Context(), 4*n, nil)
	if err != nil {
		return "", err
	}
	defer mine.Close()
	if err := fill(dev, uintptr(mine.Ptr), n, uint32(2000+me)); err != nil {
		return "", err
	}
	fd, err := mine.ExportFD()
	if err != nil {
		return "", err
	}
	defer syscallClose(fd)
	sizes, err := d.bs.AllGather(ctx, binary.LittleEndian.AppendUint64(nil, uint64(mine.Size)))
	if err != nil {
		return "", err
	}
	// Everyone sends first (the sends are buffered by the socket), then
	// receives from every peer.
	const tag = 7
	for peer := 0; peer < size; peer++ {
		if peer != me {
			if err := fx.SendFD(ctx, peer, tag, []int{fd}); err != nil {
				return "", err
			}
		}
	}
	row := make([]byte, size)
	var errs []error
	for peer := 0; peer < size; peer++ {
		if peer == me {
			row[peer] = '.'
			continue
		}
		row[peer] = 'X'
		fds, err := fx.RecvFD(ctx, peer, tag)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		peerSize := int(binary.LittleEndian.Uint64(sizes[peer]))
		imp, err := cuda.ImportVMM(cd.Context(), fds[0], peerSize, nil)
		for _, f := range fds {
			syscallClose(f)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d: import VMM from rank %d: %w", me, peer, err))
			continue
		}
		bad, err := countMismatches(dev, uintptr(imp.Ptr), n, uint32(2000+peer))
		if err == nil && bad == 0 {
			row[peer] = 'o'
		} else if err == nil {
			errs = append(errs, fmt.Errorf("rank %d reading rank %d: %d of %d words wrong", me, peer, bad, n))
		} else {
			errs = append(errs, err)
		}
		if err := imp.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := d.bs.Barrier(ctx); err != nil {
		errs = append(errs, err)
	}
	return string(row), errors.Join(errs...)
}

// checkHostBackend runs the same exchange on four goroutine ranks of the
// host backend.
func (d *doctor) checkHostBackend(ctx context.Context) {
	if d.env.Rank != 0 {
		return
	}
	const ranks = 4
	bss, err := bootstrap.NewInProcess(ranks, bootstrap.Config{})
	if err != nil {
		d.r.fail("host backend", "goroutine ranks", "%v", err)
		return
	}
	rows, err := readPeers(ctx, device.Host, bss, 1<<18)
	reportMatrix(d.r, "host backend", "goroutine ranks", rows, err)
}

// finish merges the ranks' failures on rank 0, prints, and turns failures
// into the exit status.
func (d *doctor) finish(ctx context.Context, stdout io.Writer, jsonPath string) error {
	failures := d.r.failures()
	if d.bs != nil {
		blob, _ := json.Marshal(failures)
		all, err := d.bs.AllGather(ctx, blob)
		if err != nil {
			return fmt.Errorf("doctor: gathering results: %w", err)
		}
		if d.env.Rank != 0 {
			if len(failures) > 0 {
				return fmt.Errorf("%d checks failed:\n  %s", len(failures), strings.Join(failures, "\n  "))
			}
			fmt.Fprintf(stdout, "rank %d: all checks passed\n", d.env.Rank)
			return nil
		}
		for r, b := range all[1:] {
			var f []string
			_ = json.Unmarshal(b, &f)
			for _, line := range f {
				d.r.fail("ranks", fmt.Sprintf("rank %d", r+1), "%s", line)
			}
		}
		failures = d.r.failures()
	}
	d.r.print(stdout)
	if err := writeJSON(jsonPath, d.r); err != nil {
		return err
	}
	if len(failures) > 0 {
		return fmt.Errorf("%d checks failed", len(failures))
	}
	fmt.Fprintln(stdout, "doctor: all checks passed")
	return nil
}

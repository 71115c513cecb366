package cuda

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// helperEnv selects a helper mode: the test binary re-executes itself with it
// set to act as a second process (IPC tests) or as a process without driver.
const helperEnv = "GOEP_CUDA_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

func runHelper(mode string) int {
	var err error
	switch mode {
	case "load":
		err = helperLoad()
	case "noload":
		err = helperNoLoad()
	case "ipc-mem":
		err = helperIpcMem()
	case "vmm-import":
		err = helperVMMImport()
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper %s: %v\n", mode, err)
		return 1
	}
	return 0
}

func helperLoad() error {
	err := Load()
	if err == nil {
		return errors.New("Load succeeded with a bogus " + LibraryEnv)
	}
	fmt.Printf("load error: %v\nno-driver: %v\n", err, errors.Is(err, ErrNoDriver))
	return nil
}

// helperNoLoad calls into the package with no driver loaded: every call must
// fail cleanly with CUDA_ERROR_NOT_INITIALIZED instead of crashing.
func helperNoLoad() error {
	if Load() == nil {
		return errors.New("Load succeeded with a bogus " + LibraryEnv)
	}
	ctx := &Context{}
	_, err1 := Device{}.Name()
	_, err2 := NewStream(ctx, StreamNonBlocking, 0)
	_, err3 := MemAlloc(ctx, 16)
	_, err4 := PointerMemoryType(0x1000) // goes through Load: the load error
	_, _, err5 := (&Context{}).MemGetInfo()
	for _, err := range []error{err1, err2, err3, err5} {
		if !errors.Is(err, ErrNotInitialized) {
			return fmt.Errorf("want CUDA_ERROR_NOT_INITIALIZED, got %v", err)
		}
		fmt.Println(err)
	}
	if !errors.Is(err4, ErrNoDriver) {
		return fmt.Errorf("PointerMemoryType: want the load error, got %v", err4)
	}
	fmt.Println("cuPointerGetAttribute: " + err4.Error())
	fmt.Println("done")
	return nil
}

// ---- GPU test helpers ---------------------------------------------------------

// requireGPU skips the test when no CUDA device can be used and returns
// device 0 otherwise.
func requireGPU(tb testing.TB) Device {
	tb.Helper()
	if err := Load(); err != nil {
		tb.Skipf("no CUDA GPU: %v", err)
	}
	n, err := DeviceCount()
	if err != nil {
		tb.Skipf("no CUDA GPU: %v", err)
	}
	if n == 0 {
		tb.Skip("no CUDA GPU: driver reports 0 devices")
	}
	dev, err := GetDevice(0)
	require.NoError(tb, err)
	return dev
}

// requireGPUs skips unless at least n devices are present.
func requireGPUs(tb testing.TB, n int) []Device {
	tb.Helper()
	requireGPU(tb)
	count, err := DeviceCount()
	require.NoError(tb, err)
	if count < n {
		tb.Skipf("needs %d CUDA GPUs, found %d", n, count)
	}
	devs := make([]Device, n)
	for i := range devs {
		devs[i], err = GetDevice(i)
		require.NoError(tb, err)
	}
	return devs
}

// retain retains dev's primary context for the test.
func retain(tb testing.TB, dev Device) *Context {
	tb.Helper()
	ctx, err := dev.Retain()
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, ctx.Release()) })
	return ctx
}

// gpuContext is requireGPU + retain of device 0.
func gpuContext(tb testing.TB) *Context {
	tb.Helper()
	return retain(tb, requireGPU(tb))
}

func newStream(tb testing.TB, ctx *Context) *Stream {
	tb.Helper()
	s, err := NewStream(ctx, StreamNonBlocking, 0)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, s.Destroy()) })
	return s
}

func memAlloc(tb testing.TB, ctx *Context, size int) DevicePtr {
	tb.Helper()
	p, err := MemAlloc(ctx, size)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, MemFree(ctx, p)) })
	return p
}

func hostAlloc(tb testing.TB, ctx *Context, size int, flags HostAllocFlags) *HostBuffer {
	tb.Helper()
	b, err := HostAlloc(ctx, size, flags)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, b.Free()) })
	return b
}

func loadTestModule(tb testing.TB, ctx *Context) *Module {
	tb.Helper()
	m, err := ModuleLoadData(ctx, []byte(testPTX))
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, m.Unload()) })
	return m
}

func function(tb testing.TB, m *Module, name string) *Function {
	tb.Helper()
	f, err := m.Function(name)
	require.NoError(tb, err)
	return f
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return out
}

// waitStream polls s until it is done or the timeout passes; unlike
// Synchronize it cannot hang a broken test forever.
func waitStream(tb testing.TB, s *Stream, timeout time.Duration) bool {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, err := s.Query()
		require.NoError(tb, err)
		if done {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// ---- Second-process helpers (IPC) ----------------------------------------------

const (
	ipcHandleEnv = "GOEP_CUDA_TEST_IPC_HANDLE"
	ipcEventEnv  = "GOEP_CUDA_TEST_IPC_EVENT"
	ipcSizeEnv   = "GOEP_CUDA_TEST_IPC_SIZE"
	ipcSeedEnv   = "GOEP_CUDA_TEST_IPC_SEED"
)

func helperContext() (*Context, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	dev, err := GetDevice(0)
	if err != nil {
		return nil, err
	}
	return dev.Retain()
}

func envInt(name string) (int, error) {
	v, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

func envHandle(name string) ([IpcHandleSize]byte, error) {
	var h [IpcHandleSize]byte
	b, err := hex.DecodeString(os.Getenv(name))
	if err != nil || len(b) != IpcHandleSize {
		return h, fmt.Errorf("%s: bad handle (%v)", name, err)
	}
	copy(h[:], b)
	return h, nil
}

// checkAndRewrite reads size bytes at p, compares them with
// randomBytes(seed), then writes randomBytes(seed+1) for the parent to check.
func checkAndRewrite(ctx *Context, p DevicePtr, size, seed int) error {
	got := make([]byte, size)
	if err := MemcpyDtoH(ctx, got, p); err != nil {
		return err
	}
	want := randomBytes(uint64(seed), size)
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("byte %d: got %#x, want %#x", i, got[i], want[i])
		}
	}
	return MemcpyHtoD(ctx, p, randomBytes(uint64(seed+1), size))
}

// helperIpcMem opens the parent's legacy IPC memory and event handles.
func helperIpcMem() error {
	ctx, err := helperContext()
	if err != nil {
		return err
	}
	defer ctx.Release()
	size, err := envInt(ipcSizeEnv)
	if err != nil {
		return err
	}
	seed, err := envInt(ipcSeedEnv)
	if err != nil {
		return err
	}
	mh, err := envHandle(ipcHandleEnv)
	if err != nil {
		return err
	}
	eh, err := envHandle(ipcEventEnv)
	if err != nil {
		return err
	}

	ev, err := OpenIpcEventHandle(ctx, eh)
	if err != nil {
		return err
	}
	if err := ev.Synchronize(); err != nil {
		return err
	}
	if done, err := ev.Query(); err != nil || !done {
		return fmt.Errorf("IPC event query after synchronize: done=%v err=%v", done, err)
	}

	p, err := IpcOpenMemHandle(ctx, mh)
	if err != nil {
		return err
	}
	if err := checkAndRewrite(ctx, p, size, seed); err != nil {
		return err
	}
	// Tell the parent through the shared event too: record it after our write.
	s, err := NewStream(ctx, StreamNonBlocking, 0)
	if err != nil {
		return err
	}
	if err := ev.Record(s); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	if err := s.Destroy(); err != nil {
		return err
	}
	if err := ev.Destroy(); err != nil {
		return err
	}
	if err := IpcCloseMemHandle(ctx, p); err != nil {
		return err
	}
	fmt.Println("ipc ok")
	return nil
}

// helperVMMImport imports the parent's VMM buffer from fd 3.
func helperVMMImport() error {
	ctx, err := helperContext()
	if err != nil {
		return err
	}
	defer ctx.Release()
	size, err := envInt(ipcSizeEnv)
	if err != nil {
		return err
	}
	seed, err := envInt(ipcSeedEnv)
	if err != nil {
		return err
	}
	b, err := ImportVMM(ctx, 3, size, nil)
	if err != nil {
		return err
	}
	if err := checkAndRewrite(ctx, b.Ptr, size, seed); err != nil {
		return errors.Join(err, b.Close())
	}
	if err := b.Close(); err != nil {
		return err
	}
	fmt.Println("vmm ok")
	return nil
}

func itoa(v int) string { return strconv.Itoa(v) }

func closeFD(fd int) error { return syscall.Close(fd) }

// runHelperProcessWithFD runs a helper that finds fd as its file descriptor 3.
func runHelperProcessWithFD(t *testing.T, mode string, fd int, env ...string) (string, error) {
	t.Helper()
	f := os.NewFile(uintptr(fd), "goep-test-fd")
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

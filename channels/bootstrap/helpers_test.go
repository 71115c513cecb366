package bootstrap

import (
	"context"
	"github.com/goep-dev/goep/internal/ranktest"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// checkLeaks fails the test if goroutines started during it are still alive
// shortly after it ends. Tests in this package do not run in parallel, so the
// count is meaningful.
func checkLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("goroutine leak: %d before, %d after\n%s", before, n, buf)
		}
	})
}

// freeAddr returns a loopback address nobody listens on (any more).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// forAll runs fn for every rank concurrently and returns the per-rank errors.
func forAll(n int, fn func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

func requireAllOK(t *testing.T, errs []error) {
	t.Helper()
	ranktest.NoErrors(t, errs)
}

// connectTCP starts size TCP ranks as goroutines, each with its own Connect.
func connectTCP(t *testing.T, size int, timeout time.Duration) []Bootstrap {
	t.Helper()
	addr, id := freeAddr(t), NewUniqueID()
	bs := make([]Bootstrap, size)
	errs := forAll(size, func(r int) error {
		var err error
		bs[r], err = Connect(context.Background(), Config{Rank: r, Size: size, RootAddr: addr, UniqueID: id, Timeout: timeout})
		return err
	})
	requireAllOK(t, errs)
	return bs
}

func connectInProcess(t *testing.T, size int, timeout time.Duration) []Bootstrap {
	t.Helper()
	bs, err := NewInProcess(size, Config{Timeout: timeout})
	require.NoError(t, err)
	return bs
}

func closeAll(t *testing.T, bs []Bootstrap) {
	t.Helper()
	for _, b := range bs {
		if b != nil {
			require.NoError(t, b.Close())
		}
	}
}

// kinds runs a test against both implementations.
var kinds = []struct {
	name    string
	connect func(t *testing.T, size int, timeout time.Duration) []Bootstrap
}{
	{"tcp", connectTCP},
	{"inprocess", connectInProcess},
}

func requireMentions(t *testing.T, err error, parts ...string) {
	t.Helper()
	require.Error(t, err)
	for _, p := range parts {
		require.True(t, strings.Contains(err.Error(), p), "error %q should mention %q", err, p)
	}
}

func splitHostPortInt(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}

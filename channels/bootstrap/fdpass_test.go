//go:build linux

package bootstrap

import (
	"context"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func newExchangers(t *testing.T, bs []Bootstrap, timeout time.Duration) []*FDExchanger {
	t.Helper()
	xs := make([]*FDExchanger, len(bs))
	requireAllOK(t, forAll(len(bs), func(r int) error {
		var err error
		xs[r], err = NewFDExchanger(context.Background(), bs[r], timeout)
		return err
	}))
	return xs
}

// TestFDPassPipe: rank 0 passes the write end of a pipe to rank 1, which
// writes through it; rank 0 reads what it wrote.
func TestFDPassPipe(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			fdsBefore := openFDs(t)
			bs := k.connect(t, 2, 10*time.Second)
			xs := newExchangers(t, bs, 0)
			ctx := context.Background()

			pr, pw, err := os.Pipe()
			require.NoError(t, err)
			errs := forAll(2, func(r int) error {
				if r == 0 {
					if err := xs[0].SendFD(ctx, 1, 3, []int{int(pw.Fd())}); err != nil {
						return err
					}
					return pw.Close() // rank 1 holds its own copy now
				}
				fds, err := xs[1].RecvFD(ctx, 0, 3)
				if err != nil {
					return err
				}
				if len(fds) != 1 {
					return fmt.Errorf("got %d fds", len(fds))
				}
				flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fds[0]), syscall.F_GETFD, 0)
				if errno != 0 || flags&syscall.FD_CLOEXEC == 0 {
					return fmt.Errorf("received fd is not close-on-exec (flags %#x, %v)", flags, errno)
				}
				w := os.NewFile(uintptr(fds[0]), "pipe-from-rank-0")
				if _, err := io.WriteString(w, "written by rank 1"); err != nil {
					return err
				}
				return w.Close()
			})
			requireAllOK(t, errs)
			got, err := io.ReadAll(pr) // EOF once both write ends are closed
			require.NoError(t, err)
			require.Equal(t, "written by rank 1", string(got))
			require.NoError(t, pr.Close())

			for _, x := range xs {
				require.NoError(t, x.Close())
			}
			closeAll(t, bs)
			require.Equal(t, fdsBefore, openFDs(t), "descriptor leak")
		})
	}
}

func TestFDPassManyTagsOrderAndSelf(t *testing.T) {
	checkLeaks(t)
	fdsBefore := openFDs(t)
	bs := connectInProcess(t, 3, 10*time.Second)
	defer closeAll(t, bs)
	xs := newExchangers(t, bs, 0)
	ctx := context.Background()

	// Three files; message i on tag i%2 carries i+1 of them.
	var files []*os.File
	for i := range 3 {
		f, err := os.CreateTemp(t.TempDir(), "fd")
		require.NoError(t, err)
		fmt.Fprintf(f, "file %d", i)
		files = append(files, f)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	fd := func(i int) int { return int(files[i].Fd()) }
	for _, to := range []int{1, 0} { // 0 sends to itself too
		for i := range 3 {
			var fds []int
			for j := 0; j <= i; j++ {
				fds = append(fds, fd(j))
			}
			require.NoError(t, xs[0].SendFD(ctx, to, i%2, fds))
		}
	}
	for _, at := range []int{1, 0} {
		for _, i := range []int{1, 0, 2} { // tag 1 first, then tag 0 in order
			got, err := xs[at].RecvFD(ctx, 0, i%2)
			require.NoError(t, err)
			require.Len(t, got, i+1)
			for j, g := range got {
				buf := make([]byte, 16)
				n, err := syscall.Pread(g, buf, 0)
				require.NoError(t, err)
				require.Equal(t, fmt.Sprintf("file %d", j), string(buf[:n]))
				syscall.Close(g)
			}
		}
	}
	// Unreceived descriptors are closed by Close.
	require.NoError(t, xs[0].SendFD(ctx, 2, 0, []int{fd(0), fd(1)}))
	time.Sleep(50 * time.Millisecond)
	for _, x := range xs {
		require.NoError(t, x.Close())
	}
	for _, f := range files {
		f.Close()
	}
	files = nil
	require.Equal(t, fdsBefore, openFDs(t), "descriptor leak")
}

func TestFDPassFailures(t *testing.T) {
	checkLeaks(t)
	bs := connectTCP(t, 3, 10*time.Second)
	defer closeAll(t, bs)
	xs := newExchangers(t, bs, 500*time.Millisecond)
	defer func() {
		for _, x := range xs {
			x.Close()
		}
	}()
	ctx := context.Background()

	// Timeout names the peer.
	_, err := xs[1].RecvFD(ctx, 2, 0)
	require.ErrorIs(t, err, ErrTimeout)
	requireMentions(t, err, "rank 1:", "recvfd from rank 2 tag 0 timed out after 500ms waiting for ranks [2]")

	// Bad arguments.
	requireMentions(t, xs[0].SendFD(ctx, 1, 0, nil), "0 fds")
	requireMentions(t, xs[0].SendFD(ctx, 3, 0, []int{0}), "peer 3 is outside")
	requireMentions(t, xs[0].SendFD(ctx, 1, 0, []int{-1}), "rank 0:", "sendfd to rank 1", "invalid fd -1")
	// A closed descriptor is refused by the kernel, and the link survives it.
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	defer pr.Close()
	stale := int(pw.Fd())
	pw.Close()
	requireMentions(t, xs[0].SendFD(ctx, 1, 0, []int{stale}), "bad file descriptor")
	require.NoError(t, xs[0].SendFD(ctx, 1, 0, []int{int(pr.Fd())}))
	got, err := xs[1].RecvFD(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	syscall.Close(got[0])

	// A peer on another host is refused up front.
	xs[0].peers[2].HostKey = "elsewhere"
	requireMentions(t, xs[0].SendFD(ctx, 2, 0, []int{0}), "only be passed within one host")
	xs[0].peers[2].HostKey = xs[0].peers[0].HostKey

	// A closing peer fails pending receives promptly.
	time.AfterFunc(100*time.Millisecond, func() { xs[2].Close() })
	start := time.Now()
	errs := forAll(2, func(r int) error {
		_, err := xs[r].RecvFD(ctx, 2, 5)
		return err
	})
	require.Less(t, time.Since(start), 400*time.Millisecond)
	for r, err := range errs {
		require.ErrorIs(t, err, ErrPeerClosed, "rank %d", r)
		requireMentions(t, err, "peer rank 2 is gone")
	}
	_, err = xs[2].RecvFD(ctx, 0, 0)
	require.ErrorIs(t, err, ErrClosed)
}

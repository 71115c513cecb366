package bootstrap

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Bootstrap is the out-of-band channel between the ranks of one job.
type Bootstrap interface {
	Rank() int
	Size() int
	// AllGather returns every rank's blob; result[r] is rank r's. Blobs may
	// differ in length and may be empty.
	AllGather(ctx context.Context, mine []byte) ([][]byte, error)
	Barrier(ctx context.Context) error
	// Send queues data for peer under tag (tag >= 0; negative tags are
	// reserved). It returns once the data is handed to the transport; data
	// may be reused afterwards.
	Send(ctx context.Context, peer, tag int, data []byte) error
	// Recv returns the next message from peer with tag. Messages with the
	// same (peer, tag) arrive in the order they were sent.
	Recv(ctx context.Context, peer, tag int) ([]byte, error)
	// Close releases sockets and goroutines. Pending and later calls on this
	// rank fail with ErrClosed; peers waiting on this rank get ErrPeerClosed.
	Close() error
}

// Config configures Connect (and, for Timeout and UniqueID, NewInProcess).
type Config struct {
	Rank int
	Size int
	// RootAddr is "host:port" where the others reach rank 0. Rank 0 listens
	// on exactly this address when it is loopback, otherwise on all
	// interfaces at this port (or ListenHost at this port, if set), because
	// the name others dial is not always one rank 0 can bind.
	RootAddr string
	// UniqueID identifies the job; all ranks must agree (see NewUniqueID and
	// DeriveUniqueID). It keeps strays of other jobs out of the mesh.
	UniqueID string
	// Timeout bounds every wait. Zero means $GOEP_BOOTSTRAP_TIMEOUT if set,
	// else DefaultTimeout.
	Timeout time.Duration
	// ListenHost is the host this rank listens on and advertises to its
	// peers. Empty means the local address of the connection to the root,
	// which is an address the root (and so, usually, the peers) can reach.
	// It must be an address of this host that the other ranks can reach.
	ListenHost string
}

const (
	// DefaultTimeout bounds waits when neither Config nor environment says.
	DefaultTimeout = 60 * time.Second
	// TimeoutEnv overrides DefaultTimeout, e.g. "30s" or "90" (seconds).
	TimeoutEnv = "GOEP_BOOTSTRAP_TIMEOUT"
	// MaxMessageSize caps one Send and one AllGather contribution. The
	// bootstrap is for addresses and handles; a cap keeps a corrupt or
	// foreign length prefix from allocating gigabytes.
	MaxMessageSize = 64 << 20
)

// resolveTimeout applies the Config > environment > default precedence.
func resolveTimeout(t time.Duration) (time.Duration, error) {
	if t < 0 {
		return 0, fmt.Errorf("bootstrap: Config.Timeout %s is negative", t)
	}
	if t > 0 {
		return t, nil
	}
	s := strings.TrimSpace(os.Getenv(TimeoutEnv))
	if s == "" {
		return DefaultTimeout, nil
	}
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		t = time.Duration(n * float64(time.Second))
	} else if t, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("bootstrap: %s=%q is not a duration like \"30s\"", TimeoutEnv, s)
	}
	if t <= 0 {
		return 0, fmt.Errorf("bootstrap: %s=%q must be positive", TimeoutEnv, s)
	}
	return t, nil
}

func validateRankSize(rank, size int) error {
	if size < 1 {
		return fmt.Errorf("bootstrap: size %d must be at least 1", size)
	}
	if rank < 0 || rank >= size {
		return fmt.Errorf("bootstrap: rank %d is outside [0, %d)", rank, size)
	}
	return nil
}

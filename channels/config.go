package channels

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

const (
	// DefaultWaitTimeout bounds device-side waits when neither Config nor
	// the environment says otherwise.
	DefaultWaitTimeout = 60 * time.Second
	// TimeoutEnv overrides DefaultWaitTimeout: "200ms", "30s", or a number
	// of seconds ("90").
	TimeoutEnv = "GOEP_CHANNEL_TIMEOUT"
)

// Timeouts bound the waits of a communicator's channels.
type Timeouts struct {
	// Wait bounds every device-side spin of kernels that use this
	// communicator's channels and semaphores (semaphore waits, LL packet
	// reads, goep_wait_ge_* on counters), measured with the GPU global timer
	// (the wall clock on the host backend). Zero means $GOEP_CHANNEL_TIMEOUT,
	// else DefaultWaitTimeout. Host-side setup waits are bounded by the
	// bootstrap's own timeout.
	Wait time.Duration
}

// Config configures NewCommunicator. The zero value is ready to use.
type Config struct {
	Timeouts Timeouts
	// Network configures the transport between nodes (TCP) and the nodes
	// themselves (virtual nodes of one host).
	Network NetworkConfig
}

// TimeoutsFromEnv returns the defaults with $GOEP_CHANNEL_TIMEOUT applied.
func TimeoutsFromEnv() (Timeouts, error) { return Timeouts{}.resolve() }

// resolve applies the Config > environment > default precedence.
func (t Timeouts) resolve() (Timeouts, error) {
	if t.Wait < 0 {
		return t, fmt.Errorf("channels: Timeouts.Wait %s is negative", t.Wait)
	}
	if t.Wait > 0 {
		return t, nil
	}
	s := strings.TrimSpace(os.Getenv(TimeoutEnv))
	if s == "" {
		t.Wait = DefaultWaitTimeout
		return t, nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return t, fmt.Errorf("channels: %s=%q: %w", TimeoutEnv, s, err)
	}
	t.Wait = d
	return t, nil
}

func parseDuration(s string) (time.Duration, error) {
	var d time.Duration
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		d = time.Duration(n * float64(time.Second))
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("not a duration like \"30s\" or \"200ms\"")
	}
	if d <= 0 {
		return 0, fmt.Errorf("must be positive")
	}
	return d, nil
}

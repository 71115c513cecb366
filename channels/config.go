package channels

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
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

// ErrConfigMismatch: configuration fields that must agree between ranks
// differ (AgreeConfig; the error names the fields and the ranks).
var ErrConfigMismatch = errors.New("configuration differs between ranks")

// AgreeConfig is how a component checks, at construction, that every rank
// built it with the same values of the fields that must agree: each rank
// sends its "Name=value" lines (or, when its own configuration is invalid,
// that reason) over bs, and every rank gets the same answer: nil, or an
// error wrapping ErrConfigMismatch that names each differing field as
// component.Name with the ranks holding each value (and each rank whose
// configuration was invalid, with why). A rank with a bad configuration
// thus fails every rank at once instead of leaving them waiting in setup.
// Collective: every rank calls it at the same point.
func AgreeConfig(ctx context.Context, bs bootstrap.Bootstrap, component string, fields []string, invalid error) error {
	if bs == nil {
		return errors.New("channels: AgreeConfig needs a bootstrap")
	}
	if ctx == nil {
		return errors.New("channels: AgreeConfig: nil context")
	}
	mine := strings.Join(fields, "\n")
	if invalid != nil {
		mine = "invalid: " + invalid.Error()
	}
	all, err := bs.AllGather(ctx, []byte(mine))
	if err != nil {
		return fmt.Errorf("comparing the ranks' %s: %w", component, err)
	}
	return compareConfigs(component, all)
}

// compareConfigs is the error for the ranks' field lists all (one per
// rank; a rank whose own configuration was invalid sends "invalid: why"),
// naming every field that differs and which ranks hold which value; nil
// when they agree.
func compareConfigs(component string, all [][]byte) error {
	type rankVal struct {
		rank int
		val  string
	}
	perField := map[string][]rankVal{}
	var order []string
	var invalid []string
	for r, b := range all {
		s := string(b)
		if rest, ok := strings.CutPrefix(s, "invalid: "); ok {
			invalid = append(invalid, fmt.Sprintf("rank %d: %s", r, clip(rest, 200)))
			continue
		}
		for _, line := range strings.Split(s, "\n") {
			name, val, _ := strings.Cut(line, "=")
			if _, seen := perField[name]; !seen {
				order = append(order, name)
			}
			perField[name] = append(perField[name], rankVal{r, val})
		}
	}
	var diffs []string
	for _, name := range order {
		groups := map[string][]int{}
		for _, rv := range perField[name] {
			groups[rv.val] = append(groups[rv.val], rv.rank)
		}
		if len(groups) < 2 && len(perField[name]) == len(all)-len(invalid) {
			continue
		}
		var parts []string
		for v, ranks := range groups {
			parts = append(parts, fmt.Sprintf("%s on %s", clip(v, 80), rankList(ranks)))
		}
		sort.Strings(parts)
		diffs = append(diffs, fmt.Sprintf("%s.%s: %s", component, name, strings.Join(parts, ", ")))
	}
	if len(invalid) == 0 && len(diffs) == 0 {
		return nil
	}
	msg := strings.Join(append(invalid, diffs...), "; ")
	return fmt.Errorf("%w: %s", ErrConfigMismatch, msg)
}

func rankList(ranks []int) string {
	sort.Ints(ranks)
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	if len(s) > 16 {
		s = append(s[:16], fmt.Sprintf("and %d more", len(ranks)-16))
	}
	return "ranks " + strings.Join(s, " ")
}

// clip shortens echoed input.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:n], len(s))
}

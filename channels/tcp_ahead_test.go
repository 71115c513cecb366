package channels_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// The read-ahead receiver (NetworkConfig.ReceiveAhead): the random
// operations (writes cut into 4 KiB chunks, so a write spans many sockets
// and a socket's reader is often ahead of the apply order; updates, atomic
// adds, flushes) stay byte-exact and in order, with the host backend
// staging as GPUs do, and with 2 and 3 buffers a socket (3: the ring of a
// socket's buffers not a power of two); then on the GPUs present.
func TestTCPReceiveAhead(t *testing.T) {
	for _, ahead := range []int{2, 3} {
		checkTCPVariant(t, ahead, channels.AssignStripe)
	}
}

// The free socket assignment (NetworkConfig.Assign = AssignFree: any
// socket's sender takes the next chunk), under both receivers: the same
// random operations, byte-exact and in order.
func TestTCPAssignFree(t *testing.T) {
	for _, ahead := range []int{0, 2} {
		checkTCPVariant(t, ahead, channels.AssignFree)
	}
}

// checkTCPVariant runs the random operations over TCP with 4 KiB chunks
// and the given receiver and socket assignment, on the host backend
// (staging as GPUs do) and on the GPUs present.
func checkTCPVariant(t *testing.T, ahead int, assign channels.TCPAssign) {
	for _, w := range tcpWorlds(t) {
		t.Run(w.String()+"/ahead="+strconv.Itoa(ahead)+"/"+assign.String(), func(t *testing.T) {
			if !w.gpu() {
				t.Setenv("GOEP_TCP_STAGE", "always")
			}
			nc := tcpNet(w.ranks)
			nc.ReceiveAhead, nc.ChunkBytes, nc.Assign = ahead, 4<<10, assign
			ops := tcpOpsCount() / 4
			runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
				c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: testWait}, Network: nc})
				if err != nil {
					return err
				}
				err = checkTCPRandomOps(ctx, c, seed+uint64(ahead)+uint64(assign)<<8, ops)
				return errors.Join(err, c.Close())
			})
		})
	}
}

// ReceiveAhead outside 0 and 2..16 is refused, naming the variable.
func TestTCPReceiveAheadRefused(t *testing.T) {
	for _, bad := range []int{1, 17, -1} {
		w := world{device.Host, 2}
		runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
			nc := tcpNet(2)
			nc.ReceiveAhead = bad
			c, err := channels.NewCommunicator(bs, dev, channels.Config{Network: nc})
			if err == nil {
				_ = c.Close()
				return errors.New("ReceiveAhead " + strconv.Itoa(bad) + " accepted")
			}
			for _, want := range []string{"ReceiveAhead " + strconv.Itoa(bad), channels.TCPAheadEnv} {
				if !strings.Contains(err.Error(), want) {
					return errors.New("refusal does not say " + want + ": " + err.Error())
				}
			}
			return nil
		})
	}
}

// An unknown socket assignment, from the environment or the Config, is
// refused naming it.
func TestTCPAssignRefused(t *testing.T) {
	t.Setenv(channels.TCPAssignEnv, "round-robin")
	_, err := channels.NetworkConfig{}.Resolve(2)
	if err == nil || !strings.Contains(err.Error(), channels.TCPAssignEnv) || !strings.Contains(err.Error(), "round-robin") {
		t.Fatalf("$%s=round-robin: got %v, want a refusal naming it", channels.TCPAssignEnv, err)
	}
	t.Setenv(channels.TCPAssignEnv, " FREE ")
	if nc, err := (channels.NetworkConfig{}).Resolve(2); err != nil || nc.Assign != channels.AssignFree {
		t.Fatalf("$%s=' FREE ': got %v, %v; want AssignFree", channels.TCPAssignEnv, nc.Assign, err)
	}
	t.Setenv(channels.TCPAssignEnv, "")
	if nc, err := (channels.NetworkConfig{}).Resolve(2); err != nil || nc.Assign != channels.AssignStripe {
		t.Fatalf("default: got %v, %v; want AssignStripe", nc.Assign, err)
	}
	if _, err := (channels.NetworkConfig{Assign: 7}).Resolve(2); err == nil || !strings.Contains(err.Error(), "Assign") {
		t.Fatalf("Assign 7: got %v, want a refusal", err)
	}
}

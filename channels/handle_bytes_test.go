package channels_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// The handles' bytes are what the upload functions put in device memory
// (which goep's own kernels read), carry each object's id where
// channel_abi.cuh puts it, and have the header's sizes; UploadHandleBytes
// lays them out in order, zeros for empty entries.
func TestDeviceHandleBytes(t *testing.T) {
	runRanks(t, world{device.Host, 3}, 1<<12, func(ctx context.Context, r *channeltest.Rank) error {
		if err := r.EnsurePort(ctx); err != nil {
			return err
		}
		n, me := r.Comm.Size(), r.Comm.Rank()
		out := func(a *channels.DeviceArray) []byte {
			b := make([]byte, a.Len()*a.Stride())
			_ = r.Dev.CopyOut(b, a.Ptr())
			return b
		}
		u32at := func(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }
		mem, port := out(r.Handles), out(r.PortHandles)
		var memBytes, portBytes, semBytes [][]byte
		for p := 0; p < n; p++ {
			mh, ph := r.ByRank[p].DeviceHandleBytes(), r.PortByRank[p].DeviceHandleBytes()
			memBytes, portBytes = append(memBytes, mh), append(portBytes, ph)
			if p == me {
				if mh != nil || ph != nil {
					return fmt.Errorf("own slot: nil channels give %d and %d bytes, want none", len(mh), len(ph))
				}
				semBytes = append(semBytes, nil)
				continue
			}
			mc, pc := r.ByRank[p], r.PortByRank[p]
			switch {
			case len(mh) != channels.MemoryChannelHandleSize || len(ph) != channels.PortChannelHandleSize:
				return fmt.Errorf("peer %d: handle sizes %d and %d", p, len(mh), len(ph))
			case !bytes.Equal(mh, mem[p*len(mh):(p+1)*len(mh)]):
				return fmt.Errorf("peer %d: memory channel bytes differ from the uploaded handle", p)
			case !bytes.Equal(ph, port[p*len(ph):(p+1)*len(ph)]):
				return fmt.Errorf("peer %d: port channel bytes differ from the uploaded handle", p)
			case u32at(mh, devapi.MCSem+devapi.SemID) != mc.ID() || u32at(ph, devapi.PCSem+devapi.SemID) != pc.ID():
				return fmt.Errorf("peer %d: ids in the handles are not the channels' ids", p)
			case u32at(mh, devapi.MCSem+devapi.SemPeer) != uint32(p) || u32at(ph, devapi.PCSem+devapi.SemPeer) != uint32(p):
				return fmt.Errorf("peer %d: the handles name another peer", p)
			}
			sh := mc.Semaphore().DeviceHandleBytes()
			hh := pc.Semaphore().DeviceHandleBytes()
			switch {
			case len(sh) != channels.SemaphoreHandleSize || len(hh) != channels.SemaphoreHandleSize:
				return fmt.Errorf("peer %d: semaphore handle sizes %d and %d", p, len(sh), len(hh))
			case u32at(sh, devapi.SemID) != mc.Semaphore().ID() || u32at(hh, devapi.SemID) != pc.Semaphore().ID():
				return fmt.Errorf("peer %d: semaphore ids", p)
			case binary.LittleEndian.Uint64(hh[devapi.SemRemote:]) != 0:
				return fmt.Errorf("peer %d: a host semaphore's handle can signal", p)
			}
			semBytes = append(semBytes, sh)
		}
		arr, err := r.Comm.UploadHandleBytes(channels.SemaphoreHandleSize, semBytes)
		if err != nil {
			return err
		}
		defer arr.Close()
		got := out(arr)
		for p, h := range semBytes {
			want := h
			if want == nil {
				want = make([]byte, channels.SemaphoreHandleSize)
			}
			if !bytes.Equal(want, got[p*channels.SemaphoreHandleSize:(p+1)*channels.SemaphoreHandleSize]) {
				return fmt.Errorf("uploaded semaphore %d differs", p)
			}
		}
		for _, bad := range []struct {
			stride  int
			handles [][]byte
		}{{0, semBytes}, {12, semBytes}, {channels.PortChannelHandleSize, semBytes}, {8, nil}} {
			if a, err := r.Comm.UploadHandleBytes(bad.stride, bad.handles); err == nil {
				_ = a.Close()
				return fmt.Errorf("stride %d with %d handles was accepted", bad.stride, len(bad.handles))
			}
		}
		return nil
	})
}

func TestDeviceHandleBytesOfNil(t *testing.T) {
	var m *channels.MemoryChannel
	var p *channels.PortChannel
	var s *channels.MemorySemaphore
	var h *channels.HostSemaphore
	var c *channels.Communicator
	assert.Nil(t, m.DeviceHandleBytes())
	assert.Nil(t, p.DeviceHandleBytes())
	assert.Nil(t, s.DeviceHandleBytes())
	assert.Nil(t, h.DeviceHandleBytes())
	_, err := c.UploadHandleBytes(8, [][]byte{make([]byte, 8)})
	assert.Error(t, err)
}

package internode

import (
	"errors"
	"fmt"
	"strings"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/device"
)

// SendMemory says where the rows a rank packs for other nodes live:
// dispatch's relay rows and combine's partials, the source of every
// network put of the two kernels (NotifyConfig.SendMemory).
//
// Device memory is the default. Pinned host memory takes the copy engine
// off the TCP transport's sending side, but it was no faster: alternated
// against device memory at 4096 tokens (session 16, docs/PERFORMANCE.md),
// EP2 on 2 H100s ran dispatch / combine at 5.28 / 4.66 ms against 5.11 /
// 4.61, and EP4 on 4 H100s at 14.4 / 12.2 ms against 10.8 / 8.7 (the
// kernels write every row over PCIe and the transport reads it back from
// DRAM, where a staged chunk stays in the CPU's cache; the socket reads
// on the receiving side stay the pacing stage either way).
type SendMemory int

const (
	// SendDevice: device memory. The TCP transport copies each put out of
	// the GPU into a pinned staging buffer before it sends it; the CUDA IPC
	// port transport copies device to device.
	SendDevice SendMemory = iota
	// SendHost: pinned host memory mapped into the GPU
	// (channels.RegisterHostMemory). The kernels write the rows over PCIe
	// and the TCP transport sends them straight from there; a CUDA IPC
	// port's copy engine reads them back over PCIe.
	SendHost
)

func (m SendMemory) String() string {
	switch m {
	case SendDevice:
		return "device"
	case SendHost:
		return "host"
	}
	return fmt.Sprintf("SendMemory(%d)", int(m))
}

// SendMemoryEnv names the environment variable the Buffer reads
// NotifyConfig.SendMemory from (ParseSendMemory).
const SendMemoryEnv = "GOEP_INTERNODE_SEND_MEMORY"

// ParseSendMemory reads a NotifyConfig.SendMemory: "" or "device", or
// "host".
func ParseSendMemory(v string) (SendMemory, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "device":
		return SendDevice, nil
	case "host":
		return SendHost, nil
	}
	return 0, fmt.Errorf("send memory %q: want device or host", v)
}

// allocSend makes the send memory (dl.sendBytes, zeroed) where
// cfg.SendMemory puts it, registers it and adds it to the proxy, whose id is the source of the kernels' puts. NewNotify calls
// it once the connections exist; free releases it.
func (nt *Notify) allocSend(comm *channels.Communicator) error {
	n := nt.dl.sendBytes
	if n <= 0 {
		return nil
	}
	var base uintptr
	if nt.cfg.SendMemory == SendHost {
		h, err := nt.dev.AllocHostMapped(n)
		if err != nil {
			return fmt.Errorf("send memory: %d bytes of pinned host memory: %w", n, err)
		}
		nt.sendHost = &h
		clear(h.Host)
		if nt.sendMem, err = comm.RegisterHostMemory(h); err != nil {
			return err
		}
		base = h.Dev
	} else {
		var err error
		if nt.send, err = nt.alloc(n); err != nil {
			return fmt.Errorf("send memory: %w", err)
		}
		if nt.sendMem, err = comm.RegisterMemory(nt.send); err != nil {
			return err
		}
		base = nt.send.Ptr
	}
	id, err := nt.proxy.AddMemory(nt.sendMem)
	if err != nil {
		return err
	}
	nt.dl.sendBase, nt.dl.sendID = base, uint32(id)
	return nil
}

// freeSend releases the send memory once nothing reads it any more: the
// proxy has stopped (its transports drained every put).
func (nt *Notify) freeSend() error {
	var errs []error
	if nt.sendMem.Valid() {
		if err := nt.comm.DeregisterMemory(nt.sendMem); err != nil {
			errs = append(errs, err)
		}
		nt.sendMem = channels.RegisteredMemory{}
	}
	if nt.sendHost != nil {
		errs = append(errs, nt.dev.FreeHostMapped(*nt.sendHost))
		nt.sendHost = nil
	}
	if nt.send.Ptr != 0 {
		errs = append(errs, nt.dev.Free(nt.send))
		nt.send = device.Buffer{}
	}
	nt.dl.sendBase = 0
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("internode: rank %d: close: send memory: %w", nt.rank, err)
	}
	return nil
}

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
type SendMemory int

const (
	// SendAuto is SendHost where a GPU runs the kernels and every network
	// connection of the rank is TCP, SendDevice otherwise.
	SendAuto SendMemory = iota
	// SendDevice: device memory. The TCP transport copies each put out of
	// the GPU into a pinned staging buffer before it sends it (a copy
	// engine, about 12 us a copy beyond its bytes: session 15's traces);
	// the CUDA IPC port transport copies device to device.
	SendDevice
	// SendHost: pinned host memory mapped into the GPU
	// (channels.RegisterHostMemory). The kernels write the rows over PCIe
	// and the TCP transport sends them straight from there; a CUDA IPC
	// port's copy engine would read them back over PCIe.
	SendHost
)

func (m SendMemory) String() string {
	switch m {
	case SendAuto:
		return "auto"
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

// ParseSendMemory reads a NotifyConfig.SendMemory: "" or "auto", "device"
// or "host".
func ParseSendMemory(v string) (SendMemory, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "auto":
		return SendAuto, nil
	case "device":
		return SendDevice, nil
	case "host":
		return SendHost, nil
	}
	return 0, fmt.Errorf("send memory %q: want auto, device or host", v)
}

// SendsFromHost resolves m for a rank of a kind device whose network
// connections use transports: whether its send memory is host memory.
// ep-bench puts from the same memory when it times the transport's own
// put beside the network leg.
func SendsFromHost(m SendMemory, kind device.Kind, transports []channels.Transport) bool {
	switch m {
	case SendHost:
		return true
	case SendDevice:
		return false
	}
	if kind != device.CUDA || len(transports) == 0 {
		return false
	}
	for _, t := range transports {
		if t != channels.TransportEthernet {
			return false
		}
	}
	return true
}

// allocSend makes the send memory (dl.sendBytes, zeroed) where
// cfg.SendMemory and the transports put it, registers it and adds it to
// the proxy, whose id is the source of the kernels' puts. NewNotify calls
// it once the connections exist; free releases it.
func (nt *Notify) allocSend(comm *channels.Communicator) error {
	n := nt.dl.sendBytes
	if n <= 0 {
		return nil
	}
	var base uintptr
	if SendsFromHost(nt.cfg.SendMemory, nt.dev.Info().Kind, nt.transports) {
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

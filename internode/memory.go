package internode

import (
	"fmt"

	"github.com/goep-dev/goep/internal/checked"
)

// Memory is what NewNotify allocates for a shape and config, in bytes
// (MemoryFor). The connections add their own: a TCP connection's pinned
// staging buffers on GPUs (channels.NetworkConfig).
type Memory struct {
	// RDMA is the RDMA buffer: notify's count blocks, the relay rows and
	// partials received from other nodes, the counters (device memory).
	RDMA int
	// NVLink is the workspace the node's ranks map: notify's counts, the
	// receive rows, the counters (device memory).
	NVLink int
	// Send is the send memory, the rows packed for other nodes (with
	// MaxTokens > 0 and more than one node): device memory, or pinned host
	// memory where SendHost.
	Send     int
	SendHost bool
	// Kernels is the kernels' tables and staged inputs where kernels run
	// (a GPU or the CPU emulation; device memory); the host backend's Go
	// twins allocate none of it.
	Kernels int
}

// Device is the device memory of the Memory where kernels run.
func (m Memory) Device() int {
	n := m.RDMA + m.NVLink + m.Kernels
	if !m.SendHost {
		n += m.Send
	}
	return n
}

// HostMapped is its pinned host memory (the send memory with SendHost).
func (m Memory) HostMapped() int {
	if m.SendHost {
		return m.Send
	}
	return 0
}

// MemoryFor is what NewNotify allocates for s and cfg where kernels run
// (Memory.Kernels is what the host backend does without). It checks what
// NewNotify checks of the sizes.
func MemoryFor(s Shape, cfg NotifyConfig) (Memory, error) {
	if err := s.Validate(); err != nil {
		return Memory{}, err
	}
	if cfg.MaxTokens < 0 {
		return Memory{}, fmt.Errorf("internode: max tokens %d: want >= 0", cfg.MaxTokens)
	}
	if cfg.Layouts < 0 || cfg.Layouts > MaxLayouts {
		return Memory{}, fmt.Errorf("internode: layouts %d: want 0..%d", cfg.Layouts, MaxLayouts)
	}
	dl, err := newDispatchLayout(s, cfg.MaxTokens)
	if err != nil {
		return Memory{}, fmt.Errorf("internode: %w", err)
	}
	m := Memory{RDMA: dl.rdmaBytes, NVLink: dl.nvlBytes, SendHost: cfg.SendMemory == SendHost}
	if s.Nodes > 1 {
		m.Send = dl.sendBytes
	}
	if cfg.MaxTokens > 0 {
		maxIDs, ok := checked.Mul(cfg.MaxTokens, s.TopK)
		if !ok {
			return Memory{}, fmt.Errorf("internode: %d tokens x top-k %d overflow", cfg.MaxTokens, s.TopK)
		}
		m.Kernels = s.kernelRegions(cfg.MaxTokens, maxIDs, cfg.layouts()).size
	}
	return m, nil
}

package channels

import (
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// DeviceArray is an array of device handles in device memory: kernels take
// its Ptr and index it. Entries for missing objects (nil) are zero.
type DeviceArray struct {
	c      *Communicator
	buf    device.Buffer
	n      int
	stride int
	freed  bool
}

// Ptr is the device address of element 0.
func (a *DeviceArray) Ptr() uintptr {
	if a == nil {
		var r0 uintptr
		return r0
	}
	return a.buf.Ptr
}

// Len is the number of elements.
func (a *DeviceArray) Len() int {
	if a == nil {
		var r0 int
		return r0
	}
	return a.n
}

// Stride is the size of one element in bytes.
func (a *DeviceArray) Stride() int {
	if a == nil {
		var r0 int
		return r0
	}
	return a.stride
}

// UploadMemoryChannels copies the channels' handles to device memory, in
// order; a nil entry (this rank's own slot in an array indexed by rank,
// say) becomes a zero handle.
func (c *Communicator) UploadMemoryChannels(chs []*MemoryChannel) (*DeviceArray, error) {
	if c == nil {
		var r0 *DeviceArray
		return r0, ErrNil
	}
	return c.upload(len(chs), devapi.MemoryChannelSize, func(i int, b []byte) {
		if chs[i] != nil {
			chs[i].DeviceHandle().Encode(b)
		}
	})
}

// UploadSemaphores copies the semaphores' handles to device memory.
func (c *Communicator) UploadSemaphores(sems []Semaphore) (*DeviceArray, error) {
	if c == nil {
		var r0 *DeviceArray
		return r0, ErrNil
	}
	return c.upload(len(sems), devapi.SemaphoreSize, func(i int, b []byte) {
		if sems[i] != nil {
			sems[i].DeviceHandle().Encode(b)
		}
	})
}

func (c *Communicator) upload(n, stride int, encode func(i int, b []byte)) (*DeviceArray, error) {
	if n == 0 {
		return nil, c.errorf("upload of an empty handle array")
	}
	data := make([]byte, n*stride)
	for i := 0; i < n; i++ {
		encode(i, data[i*stride:(i+1)*stride])
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return nil, err
	}
	buf, err := c.dev.Alloc(len(data))
	if err != nil {
		return nil, c.errorf("upload handles: %w", err)
	}
	if err := c.dev.CopyIn(buf.Ptr, data); err != nil {
		_ = c.dev.Free(buf)
		return nil, c.errorf("upload handles: %w", err)
	}
	a := &DeviceArray{c: c, buf: buf, n: n, stride: stride}
	c.arrays = append(c.arrays, a)
	return a, nil
}

// Close frees the array now (the communicator's Close does otherwise).
func (a *DeviceArray) Close() error {
	if a == nil {
		return ErrNil
	}
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	for i, b := range a.c.arrays {
		if b == a {
			a.c.arrays = append(a.c.arrays[:i], a.c.arrays[i+1:]...)
			break
		}
	}
	return a.freeLocked()
}

func (a *DeviceArray) freeLocked() error {
	if a.freed {
		return nil
	}
	a.freed = true
	return a.c.dev.Free(a.buf)
}

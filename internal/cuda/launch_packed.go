package cuda

import "fmt"

// LaunchPacked is Launch for callers that pack parameters themselves (the
// device layer's Args): buf holds every parameter at its natural alignment
// and offsets[i] is parameter i's byte offset in buf. Offsets outside buf
// are refused (the driver would read past it); the sizes read at each
// offset are the kernel's parameter sizes and cannot be checked here.
func LaunchPacked(fn *Function, grid, block Dim3, sharedMem int, s *Stream, buf []byte, offsets []uint32) error {
	for i, off := range offsets {
		if int(off) >= len(buf) {
			return fmt.Errorf("cuda: LaunchPacked: parameter %d at offset %d is outside the %d-byte buffer", i, off, len(buf))
		}
	}
	args := KernelArgs{buf: buf, offs: offsets}
	if r := launch(fn, grid, block, sharedMem, s, &args, 0); r != 0 {
		return launchError("cuLaunchKernel", r, &args)
	}
	return nil
}

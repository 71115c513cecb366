package cuda

// LaunchPacked is Launch for callers that pack parameters themselves (the
// device layer's Args): buf holds every parameter at its natural alignment
// and offsets[i] is parameter i's byte offset in buf.
func LaunchPacked(fn *Function, grid, block Dim3, sharedMem int, s *Stream, buf []byte, offsets []uint32) error {
	args := KernelArgs{buf: buf, offs: offsets}
	if r := launch(fn, grid, block, sharedMem, s, &args, 0); r != 0 {
		return launchError("cuLaunchKernel", r, &args)
	}
	return nil
}

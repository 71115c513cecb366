package kernels

// The channel kernels (channel_kernels.cu) exercise and measure the device
// API in channel_device.cuh, which EP, collectives and the executor include.
// The Go twins of these kernels are in kernels/twins/channels.go.
func init() {
	registry = append(registry, Module{
		Name: "channels",
		File: "channel_kernels.cu",
		Kernels: []string{
			"goep_chan_put",
			"goep_chan_get",
			"goep_chan_sem_signal",
			"goep_chan_sem_wait",
			"goep_chan_pingpong",
			"goep_chan_ll_exchange",
			"goep_chan_ll_pattern",
			"goep_chan_put_all",
			"goep_chan_compare",
			"goep_chan_wait_value",
		},
	})
}

package kernels

// Port channels: proxy_kernels.cu holds what the CPU proxy launches itself
// (atomic adds over CUDA IPC); port_kernels.cu exercises and measures the
// device API in port_device.cuh for the channels tests and `ep-bench
// channels`. Their Go twins are in kernels/twins/port.go.
func init() {
	registry = append(registry,
		Module{
			Name:    "proxy",
			File:    "proxy_kernels.cu",
			Kernels: []string{"goep_proxy_atomic_add"},
		},
		Module{
			Name: "port",
			File: "port_kernels.cu",
			Kernels: []string{
				"goep_port_stream",
				"goep_port_atomic_storm",
				"goep_port_flush_all",
				"goep_port_pingpong",
				"goep_port_put_bench",
				"goep_port_atomic_rate",
				"goep_port_signal_burst",
			},
		})
}

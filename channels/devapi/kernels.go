package devapi

// Kernel names of the channel modules, which package channels registers
// (with the host twins of these kernels): kernels/channel_kernels.cu
// exercises and measures the memory-channel API, port_kernels.cu the port
// channels, proxy_kernels.cu holds what the CPU proxy launches itself, and
// sem_lab.cu measures a signal/wait round trip piece by piece; ce_lab.cu
// loads the SMs beside a port put.
const (
	KernelChanPut        = "goep_chan_put"
	KernelChanGet        = "goep_chan_get"
	KernelChanSemSignal  = "goep_chan_sem_signal"
	KernelChanSemWait    = "goep_chan_sem_wait"
	KernelChanPingPong   = "goep_chan_pingpong"
	KernelChanLLExchange = "goep_chan_ll_exchange"
	KernelChanLLPattern  = "goep_chan_ll_pattern"
	KernelChanPutAll     = "goep_chan_put_all"
	KernelChanCompare    = "goep_chan_compare"
	KernelChanWaitValue  = "goep_chan_wait_value"

	KernelPortStream      = "goep_port_stream"
	KernelPortAtomicStorm = "goep_port_atomic_storm"
	KernelPortFlushAll    = "goep_port_flush_all"
	KernelPortPingPong    = "goep_port_pingpong"
	KernelPortPutBench    = "goep_port_put_bench"
	KernelPortAtomicRate  = "goep_port_atomic_rate"
	KernelPortSignalBurst = "goep_port_signal_burst"

	KernelProxyAtomicAdd = "goep_proxy_atomic_add"

	KernelSemLabPingPong = "goep_sem_lab_pingpong"
	KernelCELabLoad      = "goep_ce_lab_load"
)

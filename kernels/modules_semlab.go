package kernels

// sem_lab.cu measures the pieces of a signal/wait round trip (see the file);
// channels' TestSemaphoreLatencyLab runs it when asked to.
func init() {
	registry = append(registry, Module{
		Name:    "semlab",
		File:    "sem_lab.cu",
		Kernels: []string{"goep_sem_lab_pingpong"},
	})
}

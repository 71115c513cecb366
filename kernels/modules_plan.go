package kernels

// plan_exec.cu is the GPU interpreter of execution plans
// (collectives/plan/gpu packs plans for it), one kernel per element type.
func init() {
	registry = append(registry, Module{
		Name: "plan",
		File: "plan_exec.cu",
		Kernels: []string{
			"goep_plan_exec_bf16",
			"goep_plan_exec_fp16",
			"goep_plan_exec_fp32",
			"goep_plan_exec_int32",
		},
	})
}

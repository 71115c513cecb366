package kernels

// The ep API's conversion kernels (ep_convert.cu); launched through
// routing.LaunchWidenIDs, with Go twins in kernels/twins/ep.go.
func init() {
	registry = append(registry, Module{
		Name:    "ep",
		File:    "ep_convert.cu",
		Kernels: []string{"goep_ep_widen_i32"},
	})
}

package kernels

// The dispatch-layout kernels (layout.cu); launched through
// routing.LaunchLayout, with Go twins in kernels/twins/layout.go.
func init() {
	registry = append(registry, Module{
		Name:    "layout",
		File:    "layout.cu",
		Kernels: []string{"goep_layout_i64", "goep_layout_i32"},
	})
}

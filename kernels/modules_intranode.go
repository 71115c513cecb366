package kernels

// The v1 intranode notify, dispatch and combine kernels (intranode.cu);
// launched through package intranode, with Go twins in
// kernels/twins/intranode.go.
func init() {
	registry = append(registry, Module{
		Name: "intranode",
		File: "intranode.cu",
		Kernels: []string{
			"goep_intranode_notify",
			"goep_intranode_dispatch",
			"goep_intranode_combine",
		},
	})
}

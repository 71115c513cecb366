package kernels

// The intranode notify, dispatch and combine kernels (intranode.cu) and the
// TMA variant of dispatch (intranode_tma.cu: its own module, so that a
// toolchain that rejects its bulk-copy PTX costs that variant only);
// launched through package intranode, with Go twins in
// kernels/twins/intranode.go.
func init() {
	registry = append(registry, Module{
		Name: "intranode",
		File: "intranode.cu",
		Kernels: []string{
			"goep_intranode_notify",
			"goep_intranode_dispatch",
			"goep_intranode_dispatch_wide",
			"goep_intranode_combine",
			"goep_intranode_copy_rows",
		},
	}, Module{
		Name: "intranode_tma",
		File: "intranode_tma.cu",
		Kernels: []string{
			"goep_intranode_dispatch_tma",
		},
	})
}
